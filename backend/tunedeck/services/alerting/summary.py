"""Jobs as the API answers them: each with the summary of every alert it ever had, open or closed.

A finished run's alerts are closed, yet a run whose loss went NaN is not a healthy success: the team
views judge a job by the worst it ever showed, not only by what is open now."""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, Engine
from sqlmodel import Session

from tunedeck.alerts import PROBLEM_KINDS, SEVERITIES
from tunedeck.schemas import AlertSummary, JobOut
from tunedeck.store import bulk
from tunedeck.store.tables import Job

# Plain SQL on the driver's cursor: every team row and job event reads it, and SQLAlchemy's expanding
# IN costs several times the query.
_BY_JOB = (
    "SELECT job_id, kind, severity, count(*), sum(open) FROM alerts WHERE job_id IN ({}) "
    "GROUP BY job_id, kind, severity"
)
_CHUNK = 900  # SQLite's bound-parameter limit, with room


def summaries(conn: Connection, job_ids: Iterable[int]) -> dict[int, AlertSummary]:
    """One summary per job id (jobs without alerts get an empty one), from one query."""
    ids = list(dict.fromkeys(job_ids))
    counts: dict[int, dict[str, int]] = {i: {} for i in ids}
    opened = dict.fromkeys(ids, 0)
    kinds: dict[int, set[str]] = {i: set() for i in ids}
    if ids:
        db = bulk.driver_cursor(conn)
        try:
            for at in range(0, len(ids), _CHUNK):
                part = ids[at : at + _CHUNK]
                for job_id, kind, severity, n, n_open in db.execute(
                    _BY_JOB.format(", ".join("?" * len(part))), part
                ):
                    counts[job_id][severity] = counts[job_id].get(severity, 0) + n
                    opened[job_id] += int(n_open or 0)
                    kinds[job_id].add(kind)
        finally:
            db.close()
    out = {}
    for i in ids:
        known = [s for s in SEVERITIES if s in counts[i]]
        out[i] = AlertSummary(
            worst=known[-1] if known else None,
            counts=counts[i],
            open=opened[i],
            problems=[k for k in PROBLEM_KINDS if k in kinds[i]],
        )
    return out


def job_outs(session: Session, jobs: list[Job]) -> list[JobOut]:
    found = summaries(session.connection(), [j.id for j in jobs])
    return [JobOut.of(j, found[j.id]) for j in jobs]


def job_out(session: Session, job: Job) -> JobOut:
    return job_outs(session, [job])[0]


def stored_job_out(engine: Engine, job: Job) -> JobOut:
    """A job object held outside any session (an import's result) with its alerts read now."""
    with engine.connect() as conn:
        return JobOut.of(job, summaries(conn, [job.id])[job.id])
