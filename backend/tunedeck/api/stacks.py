"""Stack dumps of a job's trainer processes: asked for by a `stall` alert or by the job's owner, taken by
each node's runner with py-spy, and read back with where each rank waits."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Query, Request
from starlette.concurrency import run_in_threadpool

from tunedeck.api import auth
from tunedeck.api.answers import errors
from tunedeck.api.deps import SettingsDep, only_query, principal_name
from tunedeck.api.telemetry import runner_job
from tunedeck.contract.stacks import StackReport
from tunedeck.schemas import StacksAsked, StacksOut
from tunedeck.services.jobs import records as service
from tunedeck.store.db import SessionDep
from tunedeck.store.tables import JobStatus

router = APIRouter(prefix="/api/jobs", tags=["stacks"])


@router.post(
    "/{job_id}/telemetry/stacks",
    response_model=StacksAsked,
    responses=errors(401, 404, 409),
    tags=["telemetry"],
)
async def runner_report(
    job_id: int,
    report: StackReport,
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> dict:
    """A node's runner sends the dumps a request asked for (the job's runner token)."""
    state = request.app.state
    await run_in_threadpool(runner_job, state, job_id, authorization)
    asked = state.stacks.asked(job_id)
    if asked is None or report.request > asked:
        raise HTTPException(
            status_code=409, detail=f"job {job_id} was not asked for stack dump {report.request}"
        )
    await run_in_threadpool(state.stacks.save, job_id, report)
    return {"request": report.request}


@router.post("/{job_id}/stacks", status_code=202, response_model=StacksAsked, responses=errors(403, 404, 409))
def ask(job_id: int, request: Request, session: SessionDep, settings: SettingsDep) -> dict:
    """Ask every runner of a running job for a stack dump of its trainer processes now."""
    job = service.get_job(session, job_id)
    if not auth.may_cancel(getattr(request.state, "principal", None), job.owner, settings):
        raise HTTPException(
            status_code=403, detail=f"only its owner ({job.owner}) or an admin may dump job {job.id}'s stacks"
        )
    if job.status != JobStatus.running:
        raise HTTPException(
            status_code=409,
            detail=f"job {job_id} is {job.status.value}: only a running job's processes can be dumped",
        )
    who = principal_name(request)
    number = request.app.state.stacks.request(job_id, reason=f"asked by {who}" if who else "asked")
    return {"request": number}


@router.get(
    "/{job_id}/stacks", response_model=StacksOut, responses=errors(404), dependencies=[only_query("request")]
)
def dumps(
    job_id: int,
    request: Request,
    session: SessionDep,
    number: Annotated[int | None, Query(alias="request", ge=1, le=2**31)] = None,
) -> dict:
    """A stack-dump request (default the newest) with each node's dumps and where each rank waits."""
    service.get_job(session, job_id)
    found = request.app.state.stacks.dumps(job_id, number)
    if found is None:
        which = f" {number}" if number is not None else ": none was asked for (POST asks; a stall alert does)"
        raise HTTPException(status_code=404, detail=f"job {job_id} has no stack dump{which}")
    return found
