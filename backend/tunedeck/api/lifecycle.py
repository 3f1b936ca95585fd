"""A job's lifecycle: checkpoints, resume, clone with changes, tags and notes, delete."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Body, HTTPException, Query, Request

from tunedeck.api import auth
from tunedeck.api.answers import errors
from tunedeck.api.deps import CREATES, NodeDep, SettingsDep, job_created, only_query, principal_name
from tunedeck.schemas import CheckpointOut, CloneIn, Deleted, JobCreated, JobOut, JobPatch, ResumeIn
from tunedeck.services.alerting.summary import job_out
from tunedeck.services.jobs import checkpoints, lifecycle
from tunedeck.services.jobs import records as service
from tunedeck.store.db import SessionDep
from tunedeck.store.tables import JobStatus

router = APIRouter(prefix="/api/jobs", tags=["lifecycle"])


def _principal(request: Request):
    return getattr(request.state, "principal", None)


def _owned(request: Request, settings, job, verb: str) -> None:
    if not auth.may_cancel(_principal(request), job.owner, settings):
        raise HTTPException(
            status_code=403, detail=f"only its owner ({job.owner}) or an admin may {verb} job {job.id}"
        )


def _from_parent(request: Request, session, settings, node, job_id: int, make, **args) -> JobCreated:
    """The job `make` (resume or clone) builds from job `job_id`, owned by whoever asks."""
    parent = service.get_job(session, job_id)
    owner = principal_name(request)
    return job_created(
        request, session, make(session, settings=settings, node=node, parent=parent, owner=owner, **args)
    )


@router.get("/{job_id}/checkpoints", response_model=list[CheckpointOut], responses=errors(404))
def get_checkpoints(job_id: int, session: SessionDep) -> list[CheckpointOut]:
    """The job's checkpoints: step, time, size and what each holds."""
    return [CheckpointOut(**c) for c in checkpoints.listing(service.get_job(session, job_id))]


@router.post("/{job_id}/resume", **CREATES, responses=errors(404, 409))
def resume_job(
    job_id: int,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    node: NodeDep,
    body: Annotated[ResumeIn | None, Body()] = None,
) -> JobCreated:
    """A new job continuing this one from a checkpoint (the newest resumable by default)."""
    checkpoint = (body or ResumeIn()).checkpoint
    return _from_parent(request, session, settings, node, job_id, lifecycle.resume, checkpoint=checkpoint)


@router.post("/{job_id}/clone", **CREATES, responses=errors(404, 409, 413))
def clone_job(
    job_id: int, body: CloneIn, request: Request, session: SessionDep, settings: SettingsDep, node: NodeDep
) -> JobCreated:
    """A new job of this one's spec with some keys changed, checked like any submission."""
    return _from_parent(
        request,
        session,
        settings,
        node,
        job_id,
        lifecycle.clone,
        overrides=body.overrides,
        name=body.name,
        placing=body.model_dump(include={"env", "priority", "devices", "gpus"}, exclude_none=True),
    )


@router.patch("/{job_id}", response_model=JobOut, responses=errors(404, 409))
def patch_job(
    job_id: int, body: JobPatch, request: Request, session: SessionDep, settings: SettingsDep
) -> JobOut:
    """Set a job's tags and notes, and a queued job's priority (its owner or an admin)."""
    job = service.get_job(session, job_id)
    _owned(request, settings, job, "change")
    job = lifecycle.update(session, job, tags=body.tags, notes=body.notes, priority=body.priority)
    if body.priority is not None:
        request.app.state.scheduler.wake()  # the next pass orders the queue by it
    out = job_out(session, job)
    return out.placed(request.app.state.scheduler.queue(session) if job.status == JobStatus.queued else {})


@router.delete(
    "/{job_id}", response_model=Deleted, responses=errors(404, 409), dependencies=[only_query("files")]
)
def delete_job(
    job_id: int,
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    files: Annotated[
        Literal["keep", "remove"], Query(description="its run folder: kept or removed")
    ] = "keep",
) -> Deleted:
    """Delete a job that has ended (never a queued or running one), with or without its files."""
    job = service.get_job(session, job_id)
    _owned(request, settings, job, "delete")
    lifecycle.remove(session, job, settings=settings, files=files == "remove")
    return Deleted(id=job_id, files=files)
