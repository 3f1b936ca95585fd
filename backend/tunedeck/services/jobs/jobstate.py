"""The one owner of a job's status: every change is a guarded `move` along the table below.

A move is one UPDATE ... WHERE status IN (allowed sources), so two writers racing (a cancel and a
launch, a runner's exit and the scheduler finding it lost) cannot both win. The job change for
streams comes from the SQLite triggers on `jobs`; what a job's end must tell others (the webhooks,
the alert engine's final judgement) runs only after the transaction that ended it has committed,
so nobody hears of an end that was rolled back. Moves therefore run inside `JobState.begin()`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, update

from tunedeck.store.tables import Job, JobStatus, core, utcnow

if TYPE_CHECKING:
    from tunedeck.services.alerting.engine import AlertEngine
    from tunedeck.services.alerting.notify import Notifier

log = logging.getLogger("tunedeck.jobstate")
JOBS = core(Job)
Q, R = JobStatus.queued, JobStatus.running
ALLOWED: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (Q, R),  # the scheduler launched its runner
        (Q, JobStatus.cancelled),  # cancelled before it started
        (R, JobStatus.succeeded),
        (R, JobStatus.failed),
        (R, JobStatus.cancelled),  # its runner's report, or runner lost
    }
)
_OWNER = "tunedeck.jobstate"  # key in the connection's info: the JobState and the work left for after commit


@dataclass(frozen=True)
class Ended:
    job_id: int
    status: JobStatus
    error: str | None


class JobState:
    """Holds what a job's end is told to; one per server (the lifespan builds it)."""

    def __init__(
        self, engine: Engine, *, notifier: Notifier | None = None, alerts: AlertEngine | None = None
    ):
        self.engine, self.notifier, self.alerts = engine, notifier, alerts

    @contextmanager
    def begin(self) -> Iterator[Connection]:
        """A transaction that may move jobs; their ends are told once it has committed."""
        todo: list[Callable[[], None]] = []
        with self.engine.begin() as conn:
            conn.info[_OWNER] = (self, todo)
            try:
                yield conn
            finally:
                del conn.info[_OWNER]  # the pooled connection outlives this transaction
        for fn in todo:
            try:
                fn()
            except Exception:  # a webhook queue or alert engine that fails must not undo the commit's effect
                log.exception("after a job change")

    def ended(self, end: Ended) -> None:
        if self.notifier is not None:
            self.notifier.job_finished(end.job_id, status=end.status.value, error=end.error)
        if self.alerts is not None:
            self.alerts.job_ended(end.job_id)


def after_commit(conn: Connection, fn: Callable[[], None]) -> None:
    """Run `fn` once the `JobState.begin()` transaction holding `conn` has committed."""
    _owner(conn)[1].append(fn)


def move(
    conn: Connection,
    job_id: int,
    to: JobStatus,
    *,
    exit_code: int | None = None,
    error: str | None = None,
    **columns: Any,
) -> bool:
    """Change a job's status if the table allows it from the status it has; False (and nothing
    written) when it does not. A final state stamps the end and revokes the runner's token."""
    state, todo = _owner(conn)
    if "status" in columns:
        raise TypeError("the status is `to`")
    sources = [frm.name for frm, dest in ALLOWED if dest == to]
    values: dict[str, Any] = {}
    if to == JobStatus.running:
        values["started_at"] = utcnow()
    if to.finished:
        values.update(
            finished_at=utcnow(),
            exit_code=exit_code,
            error=error,
            runner_token_hash=None,
            eta_seconds=0.0 if to == JobStatus.succeeded else None,
        )
    values.update(columns)
    res = conn.execute(
        update(JOBS).where(JOBS.c.id == job_id, JOBS.c.status.in_(sources)).values(status=to.name, **values)
    )
    if res.rowcount == 0:
        return False
    log.info("job %s: %s", job_id, to.value)
    if to.finished:
        end = Ended(job_id, to, error)
        todo.append(lambda: state.ended(end))
    return True


def explain(conn: Connection, job_id: int, *, was: str, error: str, auto_resume: str | None = None) -> bool:
    """An ended job's error, said better once it is known (its cluster's reason for a stop that its
    runner saw only as a signal); written only while the error is still `was`, so nothing newer is
    undone. `auto_resume`: what becomes of it when the cluster's reason makes it one to continue,
    set only where nothing is set yet (a resume already made stays the one). Not a move: the
    status stays."""
    res = conn.execute(update(JOBS).where(JOBS.c.id == job_id, JOBS.c.error == was).values(error=error))
    if res.rowcount and auto_resume is not None:
        conn.execute(
            update(JOBS)
            .where(JOBS.c.id == job_id, JOBS.c.auto_resume.is_(None))
            .values(auto_resume=auto_resume)
        )
    return res.rowcount > 0


def _owner(conn: Connection) -> tuple[JobState, list[Callable[[], None]]]:
    try:
        return conn.info[_OWNER]
    except KeyError:
        raise RuntimeError("job status changes run inside JobState.begin()") from None
