"""Jobs: submit, list, read, follow metrics and logs, read the exact config, cancel."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, HTTPException, Query, Request

from tunedeck.api import auth
from tunedeck.api.answers import errors
from tunedeck.api.deps import CREATES, NodeDep, SettingsDep, job_created, only_query, principal_name
from tunedeck.api.guard import EXPOSED
from tunedeck.checks import spec as specs
from tunedeck.contract import runfiles
from tunedeck.planning.queueplan import asked
from tunedeck.schemas import (
    NAME_RULES,
    FileOut,
    JobConfigOut,
    JobCreated,
    JobKind,
    JobOut,
    JobPage,
    JobSpec,
    LogOut,
    LogPage,
    MetricOut,
    MetricPage,
)
from tunedeck.services.alerting.summary import job_out, job_outs
from tunedeck.services.jobs import lifecycle
from tunedeck.services.jobs import records as service
from tunedeck.store.db import SessionDep
from tunedeck.store.tables import JobStatus

router = APIRouter(prefix="/api/jobs", tags=["jobs"])
NOT_FOUND = errors(404)
# Row ids are SQLite integers: a larger cursor is refused by the schema, not by an overflow.
Cursor = Annotated[int | None, Query(ge=0, le=2**62, description="cursor from the previous page's `next`")]


def _queue(request: Request, session) -> dict:
    return request.app.state.scheduler.queue(session)


def _limit(settings, limit: int | None) -> int:
    return min(limit or settings.page_limit, settings.page_limit_max)


def _created(request: Request, session, settings, node, spec: JobSpec) -> JobCreated:
    owner = principal_name(request)
    return job_created(
        request, session, service.create_job(session, settings=settings, spec=spec, node=node, owner=owner)
    )


@router.post("", **CREATES, responses=errors(413))
def submit_job(
    spec: JobSpec, request: Request, session: SessionDep, settings: SettingsDep, node: NodeDep
) -> JobCreated:
    """Submit a fine-tune: LLaMA-Factory train keys, an optional DeepSpeed config, a GPU count."""
    # A parent is one the caller may read (a server with open writes may still close reads).
    principal = getattr(request.state, "principal", None)
    exposed = bool(request.scope.get(EXPOSED))
    if spec.parent_id is not None and not auth.may_read(principal, settings, exposed=exposed):
        raise HTTPException(403, detail=f"parent_id: reading job {spec.parent_id} needs a token here")
    return _created(request, session, settings, node, spec)


@router.post("/yaml", **CREATES, responses=errors(413))
def submit_yaml(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    node: NodeDep,
    name: Annotated[str, Query(**NAME_RULES)],
    body: Annotated[str, Body(media_type="application/yaml", max_length=specs.MAX_YAML_BYTES)],
    gpus: Annotated[int | None, Query(ge=0, le=64)] = None,
    kind: JobKind = "train",
    nodes: Annotated[int, Query(ge=1, le=64, description="nodes the job spans (ray executor)")] = 1,
) -> JobCreated:
    """Submit a LLaMA-Factory YAML as-is (train, or another job kind)."""
    return _created(
        request,
        session,
        settings,
        node,
        specs.spec_from_yaml(
            body, name=name, gpus=gpus, max_items=settings.spec_max_keys, kind=kind, nodes=nodes
        ),
    )


@router.get(
    "",
    response_model=JobPage,
    dependencies=[
        only_query("status", "after", "limit", "q", "owner", "tag", "created_after", "created_before")
    ],
)
def list_jobs(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    status: JobStatus | None = None,
    after: Cursor = None,
    limit: Annotated[int | None, Query(ge=1)] = None,
    q: Annotated[str | None, Query(max_length=200, description="a substring of the name or notes")] = None,
    owner: Annotated[str | None, Query(max_length=200)] = None,
    tag: Annotated[str | None, Query(max_length=50)] = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> JobPage:
    """List jobs, newest first, filtered by status, text, owner, tag and creation time."""
    jobs, nxt = lifecycle.search(
        session,
        after=after,
        limit=_limit(settings, limit),
        status=status,
        q=q,
        owner=owner,
        tag=tag,
        created_after=created_after,
        created_before=created_before,
    )
    spots = _queue(request, session) if any(j.status == JobStatus.queued for j in jobs) else {}
    return JobPage(jobs=[out.placed(spots) for out in job_outs(session, jobs)], next=nxt)


@router.get("/{job_id}", response_model=JobOut, responses=NOT_FOUND)
def get_job(job_id: int, request: Request, session: SessionDep) -> JobOut:
    """One job with its progress and alert summary; a queued one with its place in line and what it waits for."""
    job = service.get_job(session, job_id)
    return job_out(session, job).placed(_queue(request, session) if job.status == JobStatus.queued else {})


@router.get(
    "/{job_id}/metrics",
    response_model=MetricPage,
    responses=NOT_FOUND,
    dependencies=[only_query("after", "limit")],
)
def get_metrics(
    job_id: int,
    session: SessionDep,
    settings: SettingsDep,
    after: Cursor = None,
    limit: Annotated[int | None, Query(ge=1)] = None,
) -> MetricPage:
    """Metric points (one per trainer_log.jsonl line) after a cursor."""
    rows, nxt = service.metric_page(session, job_id=job_id, after=after, limit=_limit(settings, limit))
    return MetricPage(points=[MetricOut.model_validate(r, from_attributes=True) for r in rows], next=nxt)


@router.get(
    "/{job_id}/logs",
    response_model=LogPage,
    responses=NOT_FOUND,
    dependencies=[only_query("after", "limit", "q")],
)
def get_logs(
    job_id: int,
    session: SessionDep,
    settings: SettingsDep,
    after: Cursor = None,
    limit: Annotated[int | None, Query(ge=1)] = None,
    q: Annotated[
        str | None, Query(max_length=200, description="only lines holding this text (any case)")
    ] = None,
) -> LogPage:
    """Output lines (stdout, stderr, runner notes), cleaned of progress-bar control characters; `q` searches them."""
    rows, nxt = service.log_page(session, job_id=job_id, after=after, limit=_limit(settings, limit), q=q)
    return LogPage(lines=[LogOut.model_validate(r, from_attributes=True) for r in rows], next=nxt)


@router.get("/{job_id}/config", response_model=JobConfigOut, responses=NOT_FOUND)
def get_config(job_id: int, session: SessionDep) -> JobConfigOut:
    """The exact train.yaml and ds_config.json the job runs with."""
    job = service.get_job(session, job_id)
    return JobConfigOut(
        train_yaml=job.train_yaml,
        ds_config=job.ds_config,
        run_dir=job.run_dir,
        output_dir=job.output_dir,
        env=asked(job).env,
        batch_script=_batch_script(job.run_dir),
    )


def _batch_script(run_dir: str | None) -> str | None:
    """The Slurm batch script in the run folder, where the slurm executor wrote one."""
    try:
        return (Path(run_dir) / runfiles.BATCH_SCRIPT).read_text() if run_dir else None
    except OSError:
        return None


@router.get("/{job_id}/files", response_model=list[FileOut], responses=NOT_FOUND)
def get_files(job_id: int, session: SessionDep) -> list[FileOut]:
    """Files in the job's output folder."""
    return [FileOut(**f) for f in service.run_files(service.get_job(session, job_id))]


@router.post("/{job_id}/cancel", response_model=JobOut, responses=errors(404, 409))
def cancel_job(job_id: int, request: Request, session: SessionDep, settings: SettingsDep) -> JobOut:
    """Stop a job: queued ones at once, running ones gracefully (they save first)."""
    job = service.get_job(session, job_id)
    principal = getattr(request.state, "principal", None)
    if not auth.may_cancel(principal, job.owner, settings):
        raise HTTPException(
            status_code=403, detail=f"only its owner ({job.owner}) or an admin may cancel job {job_id}"
        )
    return job_out(
        session,
        service.request_cancel(
            session,
            job_id=job_id,
            executor=request.app.state.executor,
            state=request.app.state.jobstate,
            by=principal.name if principal else None,
        ),
    )
