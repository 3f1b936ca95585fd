"""Tokens/s and time left from our own timings of a job's steps, not LLaMA-Factory's.

LLaMA-Factory divides all tokens seen (a resumed run's parent's included) by its own process's
elapsed time, so after a resume it reports tens of times the real speed and an ETA of seconds.
Here both come from this job's own points: the change in tokens and steps since its first
logged step, over the runner's read times of those lines.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

MIN_SPAN_S = 0.25  # lines read together share one time: a shorter span measures nothing


# Plain SQL: read on every batch that carries steps (a text() construct costs more than the read).
FIRST = "SELECT t, step, total_tokens FROM metric_points WHERE job_id = ? AND step IS NOT NULL ORDER BY line LIMIT 1"
RESUMED = (
    "SELECT instr(char(10) || train_yaml, char(10) || 'resume_from_checkpoint: ') > 0 FROM jobs WHERE id = ?"
)


def first_point(conn: Connection, job_id: int) -> dict[str, Any] | None:
    row = conn.exec_driver_sql(FIRST, (job_id,)).first()
    return None if row is None else {"t": row[0], "step": row[1], "total_tokens": row[2]}


def resumed(conn: Connection, job_id: int) -> bool:
    """True for a job that continues a checkpoint (its train.yaml sets resume_from_checkpoint)."""
    return bool(conn.exec_driver_sql(RESUMED, (job_id,)).scalar())


def apply(rows: list[dict[str, Any]], first: dict[str, Any] | None, *, trust_logged: bool) -> None:
    """Rewrite `throughput` and `eta_seconds` of each stepped row in place, measured from `first`
    (the job's first stepped point; the first of `rows` when none is stored yet). Where too little
    time has passed, LLaMA-Factory's own figure stays when `trust_logged`, else none is given."""
    for r in rows:
        if r.get("step") is None:
            continue
        if first is None:
            first = r
        span = r["t"] - first["t"]
        steps = r["step"] - first["step"]
        if span >= MIN_SPAN_S and steps > 0:
            if r.get("total_steps") is not None:
                r["eta_seconds"] = max(0, r["total_steps"] - r["step"]) * span / steps
            tokens = (r.get("total_tokens") or 0) - (first.get("total_tokens") or 0)
            if tokens > 0:
                r["throughput"] = tokens / span
        elif not trust_logged:
            r["throughput"] = r["eta_seconds"] = None
