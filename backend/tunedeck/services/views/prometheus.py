"""What `/metrics` exports, read from SQLite at scrape time, so nothing is kept twice in memory.

Per-job series cover jobs that run now or ended less than RECENT_S ago: a finished job keeps its
final values long enough for a few scrapes, then its series end instead of piling up labels for
every job the team ever ran. Each read is an index walk: jobs by status and by finished_at, the
newest metric lines of a job by (job_id, line), the newest memory sample of each GPU by (job_id,
gpu, t), open alerts by `open`.

Labels say `job_id`, not `job`: Prometheus attaches its own `job` label (the scrape job) to every
series, and an exported `job` would be renamed `exported_job`.
"""

from __future__ import annotations

import json
import platform
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import Connection, Engine, text

from tunedeck.alerts import KINDS, SEVERITIES
from tunedeck.services.charts.memory import DEVICES, IDENTITY

RECENT_S = 600.0
TAIL_LINES = 1000  # how far back a job's latest loss, eval loss and tokens/s are looked for
NODE = platform.node() or "localhost"


def _newest(key: str) -> str:
    # SQLite stores NaN as NULL: a NULL whose raw line has the key brings the raw line back (LLaMA-Factory's
    # json.dumps writes bare NaN/Infinity). Bounded to the last TAIL_LINES lines: a key a job never logs
    # (eval_loss without evaluation) costs no walk over its whole history.
    return (
        f"(SELECT coalesce({key}, raw) FROM metric_points WHERE job_id = :job AND line > last.n - :tail "
        f"AND ({key} IS NOT NULL OR instr(raw, '\"{key}\": ')) ORDER BY line DESC LIMIT 1)"
    )


METRIC_KEYS = ("loss", "eval_loss", "throughput")
NEWEST = text(
    "WITH last(n) AS (SELECT max(line) FROM metric_points WHERE job_id = :job) "
    f"SELECT {', '.join(map(_newest, METRIC_KEYS))} FROM last"
)
# Each device's newest sample, (node, gpu) in order.
GPUS = text(
    DEVICES
    + """SELECT m.node, m.gpu, m.used_bytes, m.total_bytes, m.name, m.util, m.power_w, m.temp_c, m.temp_junction_c,
  m.temp_hbm_c, m.ecc_correctable, m.ecc_uncorrectable, m.throttle_power, m.throttle_thermal, m.throttle_hbm,
  m.clock_mhz, m.xgmi_read_bytes, m.xgmi_write_bytes FROM g JOIN memory_samples m ON m.id = (
  SELECT id FROM memory_samples WHERE job_id = :job AND node = g.node AND gpu = g.gpu ORDER BY t DESC LIMIT 1)
"""
)
JOBS = text(
    "SELECT id, name, owner, status, current_steps, total_steps FROM jobs "
    "WHERE status = 'running' OR finished_at >= :cutoff"
)  # both indexed; ORDER BY would scan the table


def latest_values(conn: Connection, job_id: int) -> dict[str, float]:
    """The newest loss, eval loss and tokens/s among a job's last TAIL_LINES lines (NaN stays NaN)."""
    found: dict[str, float] = {}
    for key, value in zip(METRIC_KEYS, conn.execute(NEWEST, {"job": job_id, "tail": TAIL_LINES}).one()):
        if isinstance(value, str):  # the raw line of a NaN or infinite value (or a key that is no number)
            value = _parse(value).get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            found[key] = float(value)
    return found


def _parse(raw: str) -> dict[str, Any]:
    try:
        d = json.loads(raw)
    except ValueError:
        return {}
    return d if isinstance(d, dict) else {}


# The labels of AMD's Device Metrics Exporter (hostname, gpu_id, serial_number, card_model, gpu_uuid,
# gpu_compute_partition_type, gpu_memory_partition_type) and of NVIDIA's DCGM exporter (Hostname,
# gpu, UUID, modelName) on one info series per job and GPU: a PromQL join (`* on(hostname, gpu_id)
# group_left(job_id, job_name) tunedeck_job_gpu_info`) puts a job's name on the exporters' series.
INFO_LABELS = (
    "hostname",
    "gpu_id",
    "serial_number",
    "card_model",
    "gpu_uuid",
    "gpu_compute_partition_type",
    "gpu_memory_partition_type",
    "Hostname",
    "UUID",
    "modelName",
)


class HardwareFamilies:
    """A job's GPUs' hardware readings from their newest sample, in Prometheus's base units."""

    def __init__(self, gpu_labels: list[str]) -> None:
        self.labels = gpu_labels
        self.util = GaugeMetricFamily(
            "tunedeck_job_gpu_utilization_ratio", "Graphics engine busy share (0..1)", labels=gpu_labels
        )
        self.power = GaugeMetricFamily(
            "tunedeck_job_gpu_power_watts",
            "Socket (board) power; absent on a GPU whose power another reports (an MI250X's secondary GCD: "
            "see tunedeck_job_gpu_power_shared_info)",
            labels=gpu_labels,
        )
        self.shared = GaugeMetricFamily(
            "tunedeck_job_gpu_power_shared_info",
            "A GPU whose power the GPU `shared_with` reports (an MI250X card's two GCDs report once; always 1)",
            labels=[*gpu_labels, "shared_with"],
        )
        self.temp = GaugeMetricFamily(
            "tunedeck_job_gpu_temperature_celsius",
            "Temperature by sensor: edge (none on MI300 parts), junction (hotspot), hbm (hottest stack)",
            labels=[*gpu_labels, "sensor"],
        )
        self.ecc = CounterMetricFamily(
            "tunedeck_job_gpu_ecc_errors",
            "ECC errors since the driver loaded, by type (correctable, uncorrectable)",
            labels=[*gpu_labels, "type"],
        )
        self.throttle = GaugeMetricFamily(
            "tunedeck_job_gpu_throttle_ratio",
            "Share of the last sampling interval the clocks were held down, by reason (power, thermal, hbm_thermal)",
            labels=[*gpu_labels, "reason"],
        )
        self.clock = GaugeMetricFamily(
            "tunedeck_job_gpu_clock_hertz", "Current graphics (SM) clock", labels=gpu_labels
        )
        # prometheus_client appends `_total` to a counter's name: tunedeck_job_gpu_xgmi_bytes_total
        self.xgmi = CounterMetricFamily(
            "tunedeck_job_gpu_xgmi_bytes",
            "Bytes over the GPU's xGMI links since the driver loaded, by direction (read, write); "
            "rate() gives bytes/s (AMD MI300 series; MI200's metrics table has no such counters)",
            labels=[*gpu_labels, "direction"],
        )
        self.info = GaugeMetricFamily(
            "tunedeck_job_gpu_info",
            "A job's GPU with the labels AMD's Device Metrics Exporter and DCGM's exporter put on theirs "
            "(always 1)",
            labels=[*gpu_labels, *INFO_LABELS],
        )

    def add(self, device: list[str], row: tuple, ident: tuple | None) -> None:
        util, power, edge, junction, hbm, ce, ue, t_power, t_thermal, t_hbm, clock, x_read, x_write = row
        if util is not None:
            self.util.add_metric(device, util / 100.0)
        if power is not None:
            self.power.add_metric(device, power)
        for sensor, v in (("edge", edge), ("junction", junction), ("hbm", hbm)):
            if v is not None:
                self.temp.add_metric([*device, sensor], v)
        for kind, v in (("correctable", ce), ("uncorrectable", ue)):
            if v is not None:
                self.ecc.add_metric([*device, kind], v)
        for reason, v in (("power", t_power), ("thermal", t_thermal), ("hbm_thermal", t_hbm)):
            if v is not None:
                self.throttle.add_metric([*device, reason], v)
        if clock is not None:
            self.clock.add_metric(device, clock * 1e6)
        for direction, v in (("read", x_read), ("write", x_write)):
            if v is not None:
                self.xgmi.add_metric([*device, direction], v)
        serial, uuid, partition, shared = ident or (None,) * 4
        if shared is not None:
            self.shared.add_metric([*device, str(shared)], 1)
        compute, _, memory = (partition or "").partition("/")
        host, gpu, name = device[2], device[3], device[4]
        self.info.add_metric(
            [*device, host, gpu, serial or "", name, uuid or "", compute, memory, host, uuid or "", name], 1
        )

    def families(self) -> Iterator[Metric]:
        yield from (
            self.util,
            self.power,
            self.shared,
            self.temp,
            self.ecc,
            self.throttle,
            self.clock,
            self.xgmi,
            self.info,
        )


class Collector:
    """A prometheus_client collector over the database and the server's live objects."""

    def __init__(
        self,
        engine: Engine,
        *,
        writer: Any = None,
        events: Any = None,
        tracker: Any = None,
        node: str = NODE,
        recent_s: float = RECENT_S,
        clock: Callable[[], float] = time.time,
    ):
        self.engine, self.writer, self.events, self.tracker = engine, writer, events, tracker
        self.node, self.recent_s, self.clock = node, recent_s, clock

    def collect(self) -> Iterator[Metric]:
        cutoff = datetime.fromtimestamp(self.clock() - self.recent_s, tz=timezone.utc).replace(tzinfo=None)
        with self.engine.connect() as conn:
            jobs = sorted(conn.execute(JOBS, {"cutoff": cutoff.strftime("%Y-%m-%d %H:%M:%S.%f")}).all())
            yield from self._jobs(conn, jobs)
            yield from self._queue(conn)
            yield from self._alerts(conn)
        yield from self._live()

    def _jobs(self, conn: Connection, jobs: list) -> Iterator[Metric]:
        labels = ["job_id", "job_name", "node"]
        info = GaugeMetricFamily(
            "tunedeck_job_info",
            "A job that runs or ended recently (always 1)",
            labels=[*labels, "owner", "status"],
        )
        fams = {
            "step": GaugeMetricFamily("tunedeck_job_step", "Optimizer steps done", labels=labels),
            "total_steps": GaugeMetricFamily(
                "tunedeck_job_total_steps", "Optimizer steps planned", labels=labels
            ),
            "loss": GaugeMetricFamily("tunedeck_job_loss", "Newest training loss", labels=labels),
            "eval_loss": GaugeMetricFamily("tunedeck_job_eval_loss", "Newest evaluation loss", labels=labels),
            "throughput": GaugeMetricFamily(
                "tunedeck_job_tokens_per_second", "Newest tokens/s that LLaMA-Factory logged", labels=labels
            ),
        }
        gpu_labels = [*labels, "gpu", "gpu_name"]
        used = GaugeMetricFamily(
            "tunedeck_job_vram_used_bytes",
            "Newest memory sample of each of the job's devices (the maximum inside "
            "the sampler's interval); gpu=host: the trainer's resident memory on a CPU job",
            labels=gpu_labels,
        )
        total = GaugeMetricFamily(
            "tunedeck_job_vram_total_bytes", "Memory of each of the job's devices", labels=gpu_labels
        )
        hw = HardwareFamilies(gpu_labels)
        for job_id, name, owner, status, step, total_steps in jobs:
            values = [str(job_id), name, self.node]
            info.add_metric([*values, owner or "", status], 1)
            for key, value in (
                ("step", step),
                ("total_steps", total_steps),
                *latest_values(conn, job_id).items(),
            ):
                if value is not None:
                    fams[key].add_metric(values, value)
            ident = {(r[0], r[1]): r[2:] for r in conn.execute(text(IDENTITY), {"job": job_id})}
            for row in conn.execute(GPUS, {"job": job_id}):
                node, gpu, used_bytes, total_bytes, gpu_name = row[:5]
                # the node that sampled it (a job on several nodes has devices on each)
                device = [*values[:2], node or self.node, "host" if gpu < 0 else str(gpu), gpu_name or ""]
                used.add_metric(device, used_bytes)
                if total_bytes is not None:
                    total.add_metric(device, total_bytes)
                if gpu >= 0:
                    hw.add(device, row[5:], ident.get((node, gpu)))
        yield info
        yield from fams.values()
        yield used
        yield total
        yield from hw.families()

    def _queue(self, conn: Connection) -> Iterator[Metric]:
        counts: dict[str, int] = dict(
            conn.execute(
                text(
                    "SELECT status, count(*) FROM jobs WHERE status IN ('queued', 'running') GROUP BY status"
                )
            ).all()
        )
        yield GaugeMetricFamily(
            "tunedeck_jobs_queued", "Jobs waiting in the queue", value=counts.get("queued", 0)
        )
        yield GaugeMetricFamily("tunedeck_jobs_running", "Jobs running", value=counts.get("running", 0))

    def _alerts(self, conn: Connection) -> Iterator[Metric]:
        rows = conn.execute(
            text("SELECT kind, severity, count(*) FROM alerts WHERE open = 1 GROUP BY kind, severity")
        ).all()
        # Every known pair, zero when none is open: a closed alert reads as 0, not as a vanished series.
        counts = {(k, s): 0 for k in KINDS for s in SEVERITIES} | {(k, s): n for k, s, n in rows}
        fam = GaugeMetricFamily("tunedeck_alerts_open", "Open alerts", labels=["kind", "severity"])
        for (kind, severity), n in sorted(counts.items()):
            fam.add_metric([kind, severity], n)
        yield fam

    def _live(self) -> Iterator[Metric]:
        w = self.writer
        if w is not None:
            depth, lag = w.backlog()
            yield GaugeMetricFamily(
                "tunedeck_ingest_queue_batches", "Telemetry batches received and not yet stored", value=depth
            )
            yield GaugeMetricFamily(
                "tunedeck_ingest_lag_seconds",
                "How long the oldest batch not yet stored has waited",
                value=lag,
            )
            yield CounterMetricFamily(
                "tunedeck_ingest_batches", "Telemetry batches the ingest writer handled", value=w.batches
            )
            yield CounterMetricFamily(
                "tunedeck_ingest_items",
                "Metric lines, log lines and memory samples in those batches (rate(): items/s)",
                value=w.items,
            )
        if self.events is not None:
            yield GaugeMetricFamily(
                "tunedeck_sse_clients", "Open live (SSE) streams", value=self.events.clients
            )
        if self.tracker is not None:
            fed = CounterMetricFamily(
                "tunedeck_alert_samples_fed",
                "Memory samples fed to the alert detectors: from the columns the ingest writer stored "
                "(`columns`), or read back from the database (`rows`: a state built, or a writer's turn missed)",
                labels=["path"],
            )
            for path, n in self.tracker.fed.items():
                fed.add_metric([path], n)
            yield fed
