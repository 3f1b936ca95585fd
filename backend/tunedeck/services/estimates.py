"""The estimate's predicted-vs-measured peak after a job ran, and its calibration per GPU kind."""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import text
from sqlmodel import Session, select

from tunedeck.tables import EstimateCalibration, Job, MetricPoint

GiB = 2**30


def measured_peak(session: Session, job: Job) -> dict[str, Any] | None:
    """The job's measured peak per GPU: sampled device memory if recorded, else LLaMA-Factory's
    `vram_reserved` (GiB, main rank). On the CPU the host samples (gpu -1) stand in."""
    row = session.execute(
        text(
            "SELECT gpu, MAX(used_bytes), MAX(name) FROM memory_samples WHERE job_id = :j "
            "GROUP BY gpu ORDER BY MAX(used_bytes) DESC LIMIT 1"
        ),
        {"j": job.id},
    ).first()
    if row is not None and row[1]:
        kind = "cpu" if row[0] == -1 else (row[2] or "gpu")
        return {"bytes": int(row[1]), "source": "memory_samples", "gpu_kind": kind}
    peak = session.exec(
        select(MetricPoint.vram_reserved)
        .where(MetricPoint.job_id == job.id)
        .order_by(MetricPoint.vram_reserved.desc())
        .limit(1)
    ).first()  # type: ignore[union-attr]
    if peak is not None and peak > 0:
        return {"bytes": int(peak * GiB), "source": "vram_reserved", "gpu_kind": "gpu" if job.gpus else "cpu"}
    return None


def job_estimate(session: Session, job: Job) -> dict[str, Any]:
    """Predicted against measured for one job; a finished job's pair is recorded for calibration."""
    predicted = json.loads(job.estimate) if job.estimate else None
    measured = measured_peak(session, job)
    out = {"job_id": job.id, "estimate": predicted, "measured": measured, "ratio": None}
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
