"""Jobs: create (validate and render), list, read, cancel, and their metric and log history."""

from __future__ import annotations

import json
import re

from sqlmodel import Session, col, select

from tunedeck.checks.submission import Node, Submission, resolve
from tunedeck.config import Settings
from tunedeck.problems import detail
from tunedeck.schemas import JobSpec
from tunedeck.services.errors import Conflict, NotFound
from tunedeck.services.jobs import artifacts
from tunedeck.services.jobs.jobstate import JobState, move
from tunedeck.store.tables import Job, JobStatus, LogLine, MetricPoint, utcnow


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.")[:40] or "job"


def create_job(
    session: Session, *, settings: Settings, spec: JobSpec, node: Node, owner: str | None = None
) -> tuple[Job, Submission]:
    """Resolve and check the spec (SpecError: a 422 listing every problem, a `parent_id` that names no
    job among them), then render it into a fresh run folder named by the job's id."""
    submission = resolve(spec, settings, node)
    if spec.parent_id is not None and session.get(Job, spec.parent_id) is None:
        submission.errors.append(detail(["parent_id"], f"job {spec.parent_id} not found"))
    checked = submission.checked()
    job = Job(
        name=spec.name,
        kind=spec.kind,
        owner=owner,
        gpus=checked.gpus,
        nodes=spec.nodes,
        parent_id=spec.parent_id,
        spec=spec.model_dump_json(exclude={"parent_id"}),  # lineage is the row's: a clone has its own
        train_yaml="",
        estimate=json.dumps(checked.estimate) if checked.estimate else None,
    )
    session.add(job)
    session.flush()  # the id names the run folder
    run_dir = settings.runs_dir / f"{job.id:06d}-{slug(spec.name)}"
    rendered = checked.write(run_dir)
    job.train_yaml, job.ds_config = rendered.train_yaml, rendered.ds_config
    job.run_dir, job.output_dir = str(run_dir), str(rendered.output_dir)
    session.commit()
    session.refresh(job)
    return job, checked


def get_job(session: Session, job_id: int) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"job {job_id} not found")
    return job


def like(text: str) -> str:
    """A LIKE pattern matching `text` anywhere, its wildcards taken literally (escape `\\`)."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _page(session: Session, model, *, job_id: int, after: int | None, limit: int, where=()):
    get_job(session, job_id)
    q = select(model).where(model.job_id == job_id, *where).order_by(col(model.id)).limit(limit)
    if after is not None:
        q = q.where(col(model.id) > after)
    rows = list(session.exec(q))
    # `next` is always the cursor to continue from, so a follower can poll with it.
    return rows, (rows[-1].id if rows else after)


def metric_page(session: Session, *, job_id: int, after: int | None, limit: int):
    return _page(session, MetricPoint, job_id=job_id, after=after, limit=limit)


def log_page(session: Session, *, job_id: int, after: int | None, limit: int, q: str | None = None):
    """Output lines after a cursor; with `q`, only those holding it (any case)."""
    where = (col(LogLine.text).ilike(like(q), escape="\\"),) if q else ()
    return _page(session, LogLine, job_id=job_id, after=after, limit=limit, where=where)


def request_cancel(session: Session, *, job_id: int, executor, state: JobState, by: str | None = None) -> Job:
    """Queued jobs end at once; running ones get the graceful stop through their runner. `by`: the
    token name that asks (the job says who stopped it)."""
    job = get_job(session, job_id)
    if job.status == JobStatus.queued:
        with state.begin() as conn:
            cancelled = move(conn, job_id, JobStatus.cancelled, cancelled_by=by)
        session.refresh(job)
        if cancelled:
            return job
        # The scheduler launched it meanwhile: it is stopped like any running job.
    if job.status.finished:
        raise Conflict(f"job {job_id} has already ended ({job.status.value})")
    if job.cancel_requested_at is None:
        job.cancel_requested_at = utcnow()
        job.cancelled_by = by
        session.add(job)
        session.commit()  # first: the runner's exit report must find it asked for (ingest's writer)
        session.refresh(job)
        executor.cancel(job)
    return job


def run_files(job: Job, *, limit: int = 1000) -> list[dict]:
    """The files a job's output folder holds (adapter, checkpoints, trainer_log.jsonl, ...), at most `limit`."""
    return artifacts.listing(job, limit=limit)
