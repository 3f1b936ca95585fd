"""A job's life after submit: resume it, clone it with changes, tag it, find it, delete it."""

from __future__ import annotations

import json
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from sqlalchemy import delete, exists, func, or_
from sqlalchemy import update as update_
from sqlmodel import Session, col, select

from tunedeck.checks.submission import Node, Submission, is_train_key
from tunedeck.config import Settings
from tunedeck.problems import SpecError, detail
from tunedeck.schemas import JobSpec
from tunedeck.services.errors import Conflict
from tunedeck.services.jobs import checkpoints
from tunedeck.services.jobs.records import create_job, like
from tunedeck.store.tables import Job, JobStatus


def _spec(job: Job) -> JobSpec:
    """The spec a job was submitted with; an imported run has none to run again."""
    try:
        return JobSpec.model_validate_json(job.spec)
    except ValueError:
        raise Conflict(
            f"job {job.id} was not submitted here (an imported run): it has no spec to run"
        ) from None


def _child(
    session: Session, *, settings: Settings, node: Node, parent: Job, spec: JobSpec, owner: str | None
) -> tuple[Job, Submission]:
    job, checked = create_job(session, settings=settings, spec=spec, node=node, owner=owner)
    job.parent_id = parent.id
    session.add(job)
    session.commit()
    session.refresh(job)
    return job, checked


def resume(
    session: Session,
    *,
    settings: Settings,
    node: Node,
    parent: Job,
    checkpoint: str | None,
    owner: str | None,
) -> tuple[Job, Submission]:
    """A new job of the parent's spec that continues from one of its checkpoints (the newest by default)."""
    spec = _spec(parent)
    folder = checkpoints.choose(parent, checkpoint)
    config = {**spec.config, "resume_from_checkpoint": str(folder)}
    return _child(
        session,
        settings=settings,
        node=node,
        parent=parent,
        spec=spec.model_copy(update={"config": config}),
        owner=owner,
    )


def clone(
    session: Session,
    *,
    settings: Settings,
    node: Node,
    parent: Job,
    overrides: dict[str, Any],
    name: str | None,
    owner: str | None,
    placing: dict[str, Any] | None = None,
) -> tuple[Job, Submission]:
    """The parent's spec with `overrides` (a null value drops the key), submitted like any new job.

    `placing` changes the spec's own fields: `env` (merged; a null value drops a variable), `priority`,
    `devices`, `gpus`. Giving `gpus` alone drops the parent's pinned `devices`."""
    unknown = [k for k in overrides if not is_train_key(k)]
    if unknown:
        raise SpecError(
            [detail(["body", "overrides", k], "is not a LLaMA-Factory train key") for k in unknown]
        )
    spec = _spec(parent)
    config = dict(spec.config)
    deepspeed = spec.deepspeed
    for key, value in overrides.items():
        if key == "deepspeed":
            deepspeed = value
        elif value is None:
            config.pop(key, None)
        else:
            config[key] = value
    # Validated again: the overrides must meet the same rules as a submitted config.
    fields = {**spec.model_dump(), "name": name or spec.name, "config": config, "deepspeed": deepspeed}
    placing = dict(placing or {})
    if "env" in placing:
        env = {**fields.get("env", {}), **placing.pop("env")}
        fields["env"] = {k: v for k, v in env.items() if v is not None}
    if "gpus" in placing and "devices" not in placing:
        fields["devices"] = None
    fields.update(placing)
    try:
        new = JobSpec.model_validate(fields)
    except ValidationError as e:  # the clone's own fields (devices, priority, env) or a config value
        raise SpecError([detail(["body", *e_["loc"]], e_["msg"]) for e_ in e.errors()]) from None
    return _child(session, settings=settings, node=node, parent=parent, spec=new, owner=owner)


def update(
    session: Session, job: Job, *, tags: list[str] | None, notes: str | None, priority: int | None = None
) -> Job:
    """Set tags (the whole list), notes and a queued job's priority; None leaves a field as it is.
    Conflict (and nothing changed) where a priority is given for a job that is no longer queued."""
    if priority is not None:
        # In the stored spec, where the scheduler reads it; guarded in SQL, so a job the scheduler
        # starts meanwhile keeps the priority it started with.
        changed = session.exec(
            update_(Job)
            .where(col(Job.id) == job.id, col(Job.status) == JobStatus.queued)
            .values(spec=func.json_set(col(Job.spec), "$.priority", priority))
        ).rowcount
        if not changed:
            session.rollback()
            session.refresh(job)
            raise Conflict(f"job {job.id} is {job.status.value}: only a queued job's priority can change")
        session.refresh(job)
    if tags is not None:
        job.tags = json.dumps(list(dict.fromkeys(tags))) if tags else None
    if notes is not None:
        job.notes = notes or None
    session.add(job)
    session.commit()
    session.refresh(job)
    return job


def remove(session: Session, job: Job, *, settings: Settings, files: bool) -> None:
    """Delete a job that has ended, and its run folder when `files` (only a folder tunedeck made)."""
    run_dir = Path(job.run_dir) if job.run_dir else None
    job_id = job.id
    session.expunge(job)
    # Guarded in SQL: a job that started meanwhile is not deleted.
    gone = session.exec(
        delete(Job)
        .where(col(Job.id) == job_id)
        .where(col(Job.status).notin_([JobStatus.queued, JobStatus.running]))
    ).rowcount
    session.commit()
    if not gone:
        raise Conflict(f"job {job_id} is queued or running: cancel it first")
    runs = settings.runs_dir.resolve()
    if files and run_dir is not None and run_dir.resolve().is_relative_to(runs) and run_dir.resolve() != runs:
        shutil.rmtree(run_dir, ignore_errors=True)


def _utc(t: datetime) -> datetime:
    """In UTC, as the column holds it; a time given without a zone is taken as UTC."""
    return t.astimezone(timezone.utc) if t.tzinfo else t.replace(tzinfo=timezone.utc)


def search(
    session: Session,
    *,
    after: int | None,
    limit: int,
    status: JobStatus | None = None,
    q: str | None = None,
    owner: str | None = None,
    tag: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> tuple[list[Job], int | None]:
    """Newest first, by any of the filters together; `after` is the cursor from the previous page."""
    query = select(Job).order_by(col(Job.id).desc()).limit(limit + 1)
    if status is not None:
        query = query.where(Job.status == status)
    if after is not None:
        query = query.where(col(Job.id) < after)
    if q:
        pattern = like(q)
        query = query.where(
            or_(col(Job.name).ilike(pattern, escape="\\"), col(Job.notes).ilike(pattern, escape="\\"))
        )
    if owner is not None:
        query = query.where(Job.owner == owner)
    if tag is not None:
        each = func.json_each(col(Job.tags)).table_valued("value")
        query = query.where(col(Job.tags).is_not(None)).where(exists().where(each.c.value == tag))
    if created_after is not None:
        query = query.where(col(Job.created_at) >= _utc(created_after))
    if created_before is not None:
        query = query.where(col(Job.created_at) < _utc(created_before))
    jobs = list(session.exec(query))
    more = len(jobs) > limit
    jobs = jobs[:limit]
    return jobs, (jobs[-1].id if more else None)
