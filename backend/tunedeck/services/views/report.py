"""A job's run report: one self-contained HTML file to attach to a ticket or an appendix.

It holds the config (train.yaml and DeepSpeed), the lint findings, the estimate against the measured
peak, the loss and memory charts (plotly.js inlined: the pages' own copy, the data embedded), the
alerts with their advice and the environment (preflight). It loads nothing from anywhere: it must
open the same way on a laptop without network years later.

Everything that came from users, runners or the trainer is escaped: text through html.escape, the
chart data as JSON whose `<`, `>` and `&` are \\u escapes, so nothing in it can close the script.
"""

from __future__ import annotations

import html
import json
import time
from functools import lru_cache
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

import plotly
from sqlmodel import Session, col, select

from tunedeck.checks.submission import Node, resolve
from tunedeck.config import Settings
from tunedeck.problems import SpecError
from tunedeck.schemas import JobOut, JobSpec, stop_message
from tunedeck.services.charts import estimates
from tunedeck.services.charts import memory as memory_charts
from tunedeck.services.charts import metrics as metric_charts
from tunedeck.store.db import engine_of
from tunedeck.store.tables import Alert, Job

MAX_POINTS = 2000  # per series: extremes kept (the pages' downsampling), the file stays a few MB
GiB = 2**30
# The full bundle (every trace type) shipped by the Python package: always there.
FULL_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
# The same plotly.js with scatter and bar only, all the charts use, a quarter of the bytes to parse:
# scripts/fetch_js.py puts it here (setup runs it; offline, the full bundle serves instead).
BASIC_JS = Path(str(resources.files("tunedeck.frontend"))) / "vendor" / "plotly-basic.min.js"
# The copy the pages are served too: the report works offline with the same plotly.js.
PLOTLY_JS = BASIC_JS if BASIC_JS.is_file() else FULL_JS
PAGE = Template((Path(__file__).with_name("report.html")).read_text())


@lru_cache
def _plotly_js(path: str) -> str:
    return Path(path).read_text()


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _json(data: Any) -> str:
    """JSON that can sit inside <script> whatever its strings hold."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"))
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _gib(n: float | None) -> str:
    return "–" if n is None else f"{n / GiB:.2f} GiB"


def _findings(job: Job, settings: Settings, node: Node) -> tuple[list[dict[str, Any]], str]:
    """The stored spec checked again now (the server keeps the spec, not the findings of its submit)."""
    try:
        spec = JobSpec.model_validate_json(job.spec)
    except ValueError:
        return [], "the stored spec is not a job spec (an imported run): not checked"
    try:
        return resolve(
            spec, settings, node
        ).findings, "the job's spec checked again when this report was made"
    except SpecError as e:
        return [
            {
                "severity": "error",
                "code": "",
                "path": ".".join(map(str, d["loc"])),
                "message": d["msg"],
                "fix": "",
            }
            for d in e.errors
        ], "the job's spec checked again when this report was made"


def _findings_html(findings: list[dict[str, Any]], note: str) -> str:
    rows = "".join(
        f'<tr class="sev-{_e(f["severity"])}"><td>{_e(f["severity"])}</td><td>{_e(f.get("code"))}</td>'
        f"<td><code>{_e(f.get('path'))}</code></td><td>{_e(f.get('message'))}"
        + (f'<div class="fix">→ {_e(f["fix"])}</div>' if f.get("fix") else "")
        + "</td></tr>"
        for f in findings
    )
    table = f"<table><tr><th>severity</th><th>code</th><th>key</th><th>finding</th></tr>{rows}</table>"
    return f'<p class="muted">{_e(note)}</p>' + (table if findings else "<p>No findings.</p>")


def _estimate_html(job: Job, measured: dict[str, Any] | None) -> str:
    predicted = json.loads(job.estimate) if job.estimate else None
    per_gpu = predicted.get("per_gpu_bytes") if isinstance(predicted, dict) else None
    got = measured["bytes"] if measured else None
    ratio = f"{got / per_gpu:.2f}×" if got and per_gpu else "–"
    source = f" ({_e(measured['source'])}, {_e(measured['gpu_kind'])})" if measured else ""
    return (
        '<table class="kv">'
        f"<tr><th>estimated peak per GPU</th><td>{_gib(per_gpu)}</td></tr>"
        f"<tr><th>measured peak</th><td>{_gib(got)}{source}</td></tr>"
        f"<tr><th>measured / estimated</th><td>{ratio}</td></tr></table>"
    )


def _alerts_html(alerts: list[Alert]) -> str:
    if not alerts:
        return "<p>No alerts.</p>"
    items = []
    for a in alerts:
        where = " · ".join(
            x
            for x in (
                ("host memory" if a.gpu == -1 else f"GPU {a.gpu}") if a.gpu is not None else "",
                f"step {a.step}" if a.step is not None else "",
                f"×{a.count}" if a.count > 1 else "",
                "open" if a.open else "resolved",
            )
            if x
        )
        items.append(
            f'<div class="alert sev-{_e(a.severity)}"><b>{_e(a.severity)}</b> <code>{_e(a.kind)}</code> '
            f'<span class="muted">{_e(where)}</span><div>{_e(a.message)}</div>'
            + (f'<div class="fix">→ {_e(a.suggestion)}</div>' if a.suggestion else "")
            + "</div>"
        )
    return "".join(items)


# An imported run trained where tunedeck never was: this server's preflight would describe the wrong machine.
IMPORTED_ENVIRONMENT = (
    "<p>Unknown: this run was imported, and its files do not say where it trained (its node, "
    "packages and devices). The preflight of this server would describe another machine.</p>"
)


def _environment_html(pf: dict[str, Any] | None) -> str:
    if not pf:
        return "<p>No preflight of the training environment was available.</p>"
    packages = "".join(
        f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in sorted(pf.get("packages", {}).items())
    )
    devices = "".join(f"<li>{_e(json.dumps(d, sort_keys=True))}</li>" for d in pf.get("devices", []))
    checks = "".join(
        f'<tr class="check-{_e(c.get("status"))}"><td>{_e(c.get("status"))}</td><td>{_e(c.get("name"))}</td>'
        f"<td>{_e(c.get('detail'))}</td><td>{_e(c.get('fix'))}</td></tr>"
        for c in pf.get("checks", [])
    )
    return (
        f"<p><b>{_e(pf.get('summary'))}</b> — backend {_e(pf.get('backend'))}, host {_e(pf.get('hostname'))}, "
        f"python <code>{_e(pf.get('python'))}</code></p>"
        f'<table class="kv">{packages}</table>'
        + (f"<ul>{devices}</ul>" if devices else "<p>No accelerator devices.</p>")
        + f"<table><tr><th>status</th><th>check</th><th>detail</th><th>fix</th></tr>{checks}</table>"
    )


def _chart_data(session: Session, job: Job) -> dict[str, Any]:
    series = metric_charts.metric_series(engine_of(session), job_id=job.id, max_points=MAX_POINTS)["series"]
    rows, _, _ = memory_charts.memory_page(
        session, job_id=job.id, gpu=None, after=None, max_points=MAX_POINTS, t0=None, t1=None, limit=10**9
    )
    gpus = {(g.node, g.gpu): g for g in memory_charts.gpus_of(session, job.id)}
    memory: dict[tuple[str, int], dict[str, Any]] = {}  # per node and GPU
    for r in rows:
        g = memory.setdefault((r.node, r.gpu), {"t": [], "gib": []})
        g["t"].append(r.t)
        g["gib"].append(r.used_bytes / GiB)
    several = len({node for node, _ in memory}) > 1  # one node: no node in the labels
    mem = []
    for (node, gpu), g in sorted(memory.items()):
        info = gpus.get((node, gpu))
        label = (
            "host memory (CPU job)"
            if gpu == -1
            else f"GPU {gpu}" + (f" {info.name}" if info and info.name else "")
        )
        if several and node:
            label = f"{node} · {label}"
        total = info.total_bytes / GiB if info and info.total_bytes and gpu != -1 else None
        mem.append({"label": label, "total_gib": total, **g})
    pick = ("loss", "eval_loss", "lr", "throughput")
    return {
        "series": {k: {"step": v["step"], "y": v["y"]} for k, v in series.items() if k in pick},
        "memory": mem,
    }


def build(
    session: Session,
    job: Job,
    *,
    settings: Settings,
    node: Node,
    preflight: dict[str, Any] | None,
    plotly_js: Path,
) -> str:
    """The report of one job, as one HTML document."""
    out = JobOut.of(job)
    findings, note = _findings(job, settings, node)
    alerts = list(session.exec(select(Alert).where(Alert.job_id == job.id).order_by(col(Alert.id))))
    facts = [
        ("status", out.status.value + (f" — {out.stopped}" if out.stopped else "")),
        ("owner", out.owner or "–"),
        ("GPUs", str(out.gpus) if out.gpus else "CPU"),
        ("steps", f"{out.progress.current_steps or 0} / {out.progress.total_steps or '?'}"),
        ("created", out.created_at.isoformat()),
        ("started", out.started_at.isoformat() if out.started_at else "–"),
        ("finished", out.finished_at.isoformat() if out.finished_at else "–"),
        ("exit code", "–" if out.exit_code is None else str(out.exit_code)),
        ("error", out.error or "–"),
        ("run folder", out.run_dir),
    ]
    return PAGE.substitute(
        title=_e(f"tunedeck report · #{job.id} {job.name}"),
        heading=_e(f"#{job.id} {job.name}"),
        made=_e(time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())),
        facts="".join(f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in facts),
        stopped=_e(stop_message(job) or ""),
        train_yaml=_e(job.train_yaml or "none recorded"),
        ds_config=_e(job.ds_config or "none"),
        findings=_findings_html(findings, note),
        estimate=_estimate_html(job, estimates.measured_peak(session, job)),
        alerts=_alerts_html(alerts),
        environment=IMPORTED_ENVIRONMENT if job.import_key else _environment_html(preflight),
        data=_json(_chart_data(session, job)),
        plotly=_plotly_js(str(plotly_js)),
    )
