"""Jobs side by side: the train.yaml keys whose values differ, and where each job ended."""

from __future__ import annotations

import json

from sqlmodel import Session, col, select

from tunedeck.services.jobs.records import get_job
from tunedeck.store.tables import Job, MetricPoint

# What each job's answer says of its end: the last logged value of each (an eval line carries
# eval_loss and no loss, so each column's own last value, not the last line's).
LAST = ("step", "loss", "eval_loss", "grad_norm", "throughput")
SAME_ALWAYS = frozenset({"output_dir"})  # each job's own folder: never a difference worth showing


def last_values(session: Session, job_id: int) -> dict[str, float | int | None]:
    """Each LAST column's value on the job's newest point that logged it (None: never logged)."""
    out: dict[str, float | int | None] = {}
    for name in LAST:
        column = col(getattr(MetricPoint, name))
        q = (
            select(column)
            .where(MetricPoint.job_id == job_id, column.is_not(None))
            .order_by(col(MetricPoint.id).desc())
            .limit(1)
        )
        out[name] = session.exec(q).first()
    return out


def compare(session: Session, *, job_ids: list[int]) -> tuple[list[tuple[Job, dict]], dict[str, dict]]:
    """Each job with its last values, and the config keys that differ: key -> job id -> value (None
    where a job does not set it), values whole, as the job's train.yaml holds them."""
    jobs = [get_job(session, j) for j in job_ids]  # NotFound for the first unknown id
    configs = {job.id: job.config() for job in jobs}
    keys = sorted({k for c in configs.values() for k in c} - SAME_ALWAYS)
    differ = {
        k: {str(j): configs[j].get(k) for j in configs}
        for k in keys
        if len({json.dumps(c.get(k), sort_keys=True, default=str) for c in configs.values()}) > 1
    }
    return [(job, last_values(session, job.id)) for job in jobs], differ
