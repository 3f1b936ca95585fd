"""The estimate's predicted-vs-measured peak after a job ran, and its calibration per GPU kind."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text
from sqlmodel import Session, select

from tunedeck.services.charts import memory as memory_charts
from tunedeck.services.charts import pyramid
from tunedeck.store.db import engine_of
from tunedeck.store.tables import EstimateCalibration, Job

GiB = 2**30


def measured_peak(session: Session, job: Job) -> dict[str, Any] | None:
    """The job's measured peak per GPU: sampled device memory if recorded, else LLaMA-Factory's
    `vram_reserved` (GiB, main rank). On the CPU the host samples (gpu -1) stand in. Read from the
    chart tiles' top level (a few rows, not a scan of a long run's samples; kept by retention too)."""
    pyramid.current(engine_of(session))
    # The whole key, one series at a time: a handful of rows (a LIKE on the series walks every tile).
    top = (
        "SELECT max(y_max) FROM chart_tiles WHERE job_id = :j AND series = :s AND (level = :top OR "
        "(level = :fine AND tile = (SELECT tile FROM chart_open WHERE job_id = :j AND series = :s)))"
    )  # the top level, and the open tile it does not hold yet
    at = {"j": job.id, "top": pyramid.LEVELS, "fine": pyramid.FINEST}
    peaks = [
        (session.execute(text(top), {**at, "s": pyramid.memory_key(g.node, g.gpu)}).scalar(), g)
        for g in memory_charts.gpus_of(session, job.id)
    ]
    peak, g = max(((p, g) for p, g in peaks if p is not None), key=lambda x: x[0], default=(None, None))
    if peak and g is not None:
        kind = "cpu" if g.gpu == -1 else (g.name or "gpu")
        return {"bytes": int(peak), "source": "memory_samples", "gpu_kind": kind}
    peak = session.execute(text(top), {**at, "s": pyramid.metric_key("vram_reserved")}).scalar()
    if peak is not None and peak > 0:
        return {"bytes": int(peak * GiB), "source": "vram_reserved", "gpu_kind": "gpu" if job.gpus else "cpu"}
    return None


def job_estimate(session: Session, job: Job) -> dict[str, Any]:
    """Predicted against measured for one job; a finished job's pair is recorded for calibration."""
    predicted = json.loads(job.estimate) if job.estimate else None
    measured = measured_peak(session, job)
    out: dict[str, Any] = {"job_id": job.id, "estimate": predicted, "measured": measured, "ratio": None}
    if predicted and measured:
        out["ratio"] = measured["bytes"] / predicted["per_gpu_bytes"]
        if (
            job.status.finished
            and session.exec(
                select(EstimateCalibration.id).where(EstimateCalibration.job_id == job.id)
            ).first()
            is None
        ):
            session.add(
                EstimateCalibration(
                    job_id=job.id,
                    gpu_kind=measured["gpu_kind"],
                    predicted_bytes=predicted["per_gpu_bytes"],
                    measured_bytes=measured["bytes"],
                    source=measured["source"],
                    ratio=out["ratio"],
                )
            )
            session.commit()
    return out


def calibration(session: Session) -> list[dict[str, Any]]:
    """Per GPU kind: how many finished jobs, and the mean and range of measured / predicted."""
    rows = session.execute(
        text(
            "SELECT gpu_kind, COUNT(*), AVG(ratio), MIN(ratio), MAX(ratio) "
            "FROM estimate_calibrations GROUP BY gpu_kind ORDER BY gpu_kind"
        )
    ).all()
    return [
        {"gpu_kind": r[0], "jobs": r[1], "mean_ratio": r[2], "min_ratio": r[3], "max_ratio": r[4]}
        for r in rows
    ]
