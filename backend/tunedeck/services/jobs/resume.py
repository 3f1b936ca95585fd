"""Runs that their allocation's time limit or a preemption stopped go on by themselves.

A runner warned that its allocation ends (SIGUSR1: Slurm's `--signal`, which the Slurm executor asks
for `slurm_warn_s` before the limit, and sends at a preemption where the site has it sent) stops its
trainer after the step with a checkpoint; the writer fails the job with the time limit as its cause
and `auto_resume = pending`, and the scheduler, once the cluster says it was a preemption, says that
instead (a preemption with no warning is pending too: the newest checkpoint saved before it counts). Each pass here resumes
every pending job from its newest checkpoint as a new job (services/jobs/lifecycle.resume: the same
checks as a submission, `parent_id` the stopped attempt, so the page draws the attempts as one curve)
and writes on the stopped job what became of it. A job already resumed by hand is left to that
resume; a chain of `auto_resume_attempts` time-limited attempts is not resumed again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Engine
from sqlmodel import Session, col, select

from tunedeck.checks.submission import Node
from tunedeck.config import Settings
from tunedeck.problems import SpecError
from tunedeck.services.errors import Conflict, NotFound
from tunedeck.services.ingest.writer import RESUME_PENDING
from tunedeck.services.jobs import lifecycle
from tunedeck.store.tables import Job, JobStatus
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.services.jobs.resume")


def attempts(session: Session, job: Job, most: int) -> int:
    """How many time-limited attempts end the chain at `job` (it included), counted up to `most`."""
    n, seen = 0, set()
    at: Job | None = job
    while at is not None and at.auto_resume is not None and at.id not in seen and n < most:
        n += 1
        seen.add(at.id)
        at = session.get(Job, at.parent_id) if at.parent_id is not None else None
    return n


class Resumer(Worker):
    name = "auto-resume"

    def __init__(
        self, *, engine: Engine, settings: Settings, node: Callable[[], Node], wake: Callable[[], None]
    ):
        super().__init__()
        self.engine, self.settings, self.node, self.wake_scheduler = engine, settings, node, wake
        self.interval_s = max(settings.scheduler_interval_s, 1.0)

    def run_once(self) -> None:
        with Session(self.engine) as session:
            pending = session.exec(
                select(Job).where(Job.auto_resume == RESUME_PENDING, Job.status == JobStatus.failed)
            )
            for job in list(pending):
                job.auto_resume = self._resume(session, job)
                session.add(job)
                session.commit()
                log.info("job %s: %s", job.id, job.auto_resume)

    def _resume(self, session: Session, job: Job) -> str:
        """What became of the stopped job: the new attempt, or why there is none."""
        if session.exec(select(Job.id).where(col(Job.parent_id) == job.id)).first() is not None:
            return "not resumed: it was resumed or cloned by hand already"
        most = self.settings.auto_resume_attempts
        if attempts(session, job, most + 1) > most:
            return (
                f"not resumed: {most} attempts in a row were stopped by the end of their allocation (a time "
                "limit or a preemption; TUNEDECK_AUTO_RESUME_ATTEMPTS)"
            )
        try:
            child, _ = lifecycle.resume(
                session,
                settings=self.settings,
                node=self.node(),
                parent=job,
                checkpoint=None,
                owner=job.owner,
            )
        except (Conflict, NotFound, SpecError) as e:  # no checkpoint saved; the spec no longer passes
            return f"not resumed: {e}"
        self.wake_scheduler()
        return f"resumed as job {child.id}"
