"""Write the Grafana dashboard of a team's tunedeck server (docs/grafana/tunedeck.json) from the series
`/metrics` exports, built with Grafana's own typed builders (grafana-foundation-sdk), so the file keeps
to Grafana's dashboard schema. tests/telemetry/test_dashboard.py checks the file against this script
and every query's series against a real server's scrape.

    python scripts/grafana_dashboard.py           write the file
    python scripts/grafana_dashboard.py --check   exit 1 if the file differs from what this writes
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

OUT = Path(__file__).resolve().parent.parent / "docs" / "grafana" / "tunedeck.json"
SOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
# The dashboard's filters: every per-job query keeps to the chosen owners' and jobs' series.
JOBS = 'job_id=~"$job_id"'
OWNED = 'on(job_id) group_left(owner) tunedeck_job_info{owner=~"$owner", job_id=~"$job_id"}'


def query(expr: str, legend: str) -> prometheus.Dataquery:
    return prometheus.Dataquery().expr(expr).legend_format(legend).datasource(SOURCE)


def per_job(metric: str, extra: str = "") -> str:
    """A job series kept to the dashboard's owner and job filters (tunedeck_job_info holds the owner)."""
    labels = f"{JOBS}, {extra}" if extra else JOBS
    return f"{metric}{{{labels}}} * {OWNED}"


def chart(title: str, unit: str, what: str, *targets: prometheus.Dataquery) -> timeseries.Panel:
    panel = timeseries.Panel().title(title).description(what).unit(unit).datasource(SOURCE).height(8).span(12)
    for i, t in enumerate(targets):
        panel = panel.with_target(t.ref_id(chr(ord("A") + i)))
    return panel


def number(title: str, expr: str, what: str, unit: str = "none") -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .description(what)
        .unit(unit)
        .datasource(SOURCE)
        .height(4)
        .span(6)
        .with_target(query(expr, title).instant().ref_id("A"))
    )


def variable(name: str, label: str, values: str) -> gd.QueryVariable:
    return (
        gd.QueryVariable(name)
        .label(label)
        .datasource(SOURCE)
        .query(f"label_values({values})")
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(model.VariableSort.ALPHABETICAL_ASC)
    )


def build() -> model.Dashboard:
    gpu = "#{{job_id}} {{job_name}} GPU {{gpu}}"
    board = (
        gd.Dashboard("tunedeck: jobs, GPUs and alerts")
        .uid("tunedeck-jobs")
        .description(
            "A team's fine-tunes from tunedeck's /metrics: progress, loss, throughput, each job's GPUs "
            "(memory, power, temperatures, ECC, throttling, xGMI traffic) and the open alerts."
        )
        .tags(["tunedeck", "llm", "fine-tuning"])
        .refresh("30s")
        .time("now-6h", "now")
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .with_variable(gd.DatasourceVariable("datasource").label("Prometheus").type("prometheus"))
        .with_variable(variable("owner", "owner", "tunedeck_job_info, owner"))
        .with_variable(variable("job_id", "job", 'tunedeck_job_info{owner=~"$owner"}, job_id'))
        .with_row(gd.Row("Team"))
        .with_panel(number("Running", "tunedeck_jobs_running", "Jobs running now"))
        .with_panel(number("Queued", "tunedeck_jobs_queued", "Jobs waiting for devices"))
        .with_panel(
            number("Open critical alerts", 'sum(tunedeck_alerts_open{severity="critical"})', "Every job's")
        )
        .with_panel(number("Ingest lag", "tunedeck_ingest_lag_seconds", "Wait of the oldest batch", "s"))
        .with_panel(
            table.Panel()
            .title("Jobs")
            .description("Running and recently ended jobs, with owner and status")
            .datasource(SOURCE)
            .height(8)
            .span(12)
            .with_target(
                query('tunedeck_job_info{owner=~"$owner", job_id=~"$job_id"}', "")
                .instant()
                .format(PromQueryFormat.TABLE)
                .ref_id("A")
            )
        )
        .with_panel(
            chart(
                "Open alerts",
                "none",
                "Open alerts by kind and severity",
                query("sum by (kind, severity) (tunedeck_alerts_open) > 0", "{{kind}} ({{severity}})"),
            )
        )
        .with_row(gd.Row("Training"))
        .with_panel(
            chart(
                "Loss",
                "none",
                "Newest training and evaluation loss",
                query(per_job("tunedeck_job_loss"), "#{{job_id}} {{job_name}} loss"),
                query(per_job("tunedeck_job_eval_loss"), "#{{job_id}} {{job_name}} eval loss"),
            )
        )
        .with_panel(
            chart(
                "Progress",
                "percentunit",
                "Optimizer steps done of those planned",
                query(
                    f"({per_job('tunedeck_job_step')}) / on(job_id) tunedeck_job_total_steps",
                    "#{{job_id}} {{job_name}}",
                ),
            )
        )
        .with_panel(
            chart(
                "Throughput",
                "none",
                "Tokens per second that LLaMA-Factory logged",
                query(per_job("tunedeck_job_tokens_per_second"), "#{{job_id}} {{job_name}}"),
            )
        )
        .with_row(gd.Row("GPUs"))
        .with_panel(
            chart(
                "Memory used",
                "percentunit",
                "Each GPU's used share of its memory (flat is healthy; spikes and ramps alert)",
                query(
                    f"({per_job('tunedeck_job_vram_used_bytes')}) / on(job_id, gpu) tunedeck_job_vram_total_bytes",
                    gpu,
                ),
            )
        )
        .with_panel(
            chart(
                "Utilisation",
                "percentunit",
                "Graphics engine busy share",
                query(per_job("tunedeck_job_gpu_utilization_ratio"), gpu),
            )
        )
        .with_panel(
            chart(
                "Power",
                "watt",
                "Socket power; an MI250X's secondary GCD has none (its card's primary reports the card)",
                query(per_job("tunedeck_job_gpu_power_watts"), gpu),
            )
        )
        .with_panel(
            chart(
                "Temperature",
                "celsius",
                "Edge (none on MI300 parts), junction and HBM sensors",
                query(per_job("tunedeck_job_gpu_temperature_celsius"), gpu + " {{sensor}}"),
            )
        )
        .with_panel(
            chart(
                "Throttling",
                "percentunit",
                "Share of the sampling interval the clocks were held down, by reason",
                query(per_job("tunedeck_job_gpu_throttle_ratio"), gpu + " {{reason}}"),
            )
        )
        .with_panel(
            chart(
                "ECC errors",
                "none",
                "New ECC errors in the window, by type: any uncorrectable one is an alert",
                query(
                    f"increase(tunedeck_job_gpu_ecc_errors_total{{{JOBS}}}[$__rate_interval]) * {OWNED}",
                    gpu + " {{type}}",
                ),
            )
        )
        .with_panel(
            chart(
                "Clock",
                "hertz",
                "Graphics (SM) clock",
                query(per_job("tunedeck_job_gpu_clock_hertz"), gpu),
            )
        )
        .with_panel(
            chart(
                "xGMI traffic",
                "Bps",
                "Bytes per second over each GPU's xGMI links, by direction (AMD MI300 series)",
                query(
                    f"rate(tunedeck_job_gpu_xgmi_bytes_total{{{JOBS}}}[$__rate_interval]) * {OWNED}",
                    gpu + " {{direction}}",
                ),
            )
        )
        .with_row(gd.Row("Server"))
        .with_panel(
            chart(
                "Ingest",
                "none",
                "Telemetry items stored per second, and batches waiting",
                query("rate(tunedeck_ingest_items_total[$__rate_interval])", "items/s"),
                query("tunedeck_ingest_queue_batches", "batches waiting"),
            )
        )
        .with_panel(
            chart(
                "Server process",
                "bytes",
                "Resident memory of the server and its ingest store",
                query("process_resident_memory_bytes", "server"),
                query("tunedeck_ingest_store_process_resident_memory_bytes", "ingest store"),
            )
        )
    )
    return board.build()


def render() -> str:
    return json.dumps(build(), cls=JSONEncoder, indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT} is not what scripts/grafana_dashboard.py writes: run it", file=sys.stderr)
            return 1
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
