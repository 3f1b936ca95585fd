"""Runs from outside tunedeck: a LLaMA-Factory output folder's files, stored as a finished job.

The body may be up to TUNEDECK_IMPORT_MAX_BYTES, not TUNEDECK_MAX_BODY_BYTES (main.py includes this
router with that limit): its files stream to disk as they come, never into one JSON body.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, HTTPException, Request, Response, UploadFile, status
from starlette.concurrency import run_in_threadpool

from tunedeck.alerts.rundir import BadInput
from tunedeck.api.answers import TOO_LARGE, Responses
from tunedeck.api.deps import SettingsDep, principal_name
from tunedeck.schemas import NAME_RULES, JobOut
from tunedeck.services.alerting.summary import stored_job_out
from tunedeck.services.jobs.imports import BadUpload, import_run

router = APIRouter(prefix="/api/runs", tags=["runs"])
ANSWERS: Responses = {
    200: {"model": JobOut, "description": "the same files, name and owner were imported before: that job"},
    413: {**TOO_LARGE, "description": "the request body is larger than TUNEDECK_IMPORT_MAX_BYTES"},
}


@router.post("/import", status_code=status.HTTP_201_CREATED, response_model=JobOut, responses=ANSWERS)
async def import_run_route(
    request: Request,
    response: Response,
    settings: SettingsDep,
    trainer_log: Annotated[UploadFile, File(description="LLaMA-Factory's trainer_log.jsonl")],
    memory: Annotated[
        UploadFile | None, File(description="CSV with the header t,gpu,used_bytes,total_bytes")
    ] = None,
    config: Annotated[UploadFile | None, File(description="the run's train.yaml")] = None,
    log: Annotated[
        UploadFile | None, File(description="the run's output (OOM and allocator-flush lines)")
    ] = None,
    name: Annotated[str, Form(**NAME_RULES)] = "imported run",
) -> JobOut:
    """Store an outside run as a finished job with its loss and memory charts and its alerts (once:
    the same import again answers 200 with that job)."""
    files = {"trainer_log": trainer_log, "memory": memory, "config": config, "log": log}
    try:
        job, new = await run_in_threadpool(
            import_run,
            request.app.state.engine,
            settings=settings,
            name=name,
            files={k: f.file for k, f in files.items() if f is not None},
            owner=principal_name(request),
            state=request.app.state.jobstate,
        )
    except BadUpload as e:
        raise HTTPException(
            422, detail=[{"loc": ["body", e.field], "msg": str(e), "type": "value_error"}]
        ) from None
    except BadInput as e:
        raise HTTPException(422, detail=[{"loc": ["body"], "msg": str(e), "type": "value_error"}]) from None
    if not new:
        response.status_code = status.HTTP_200_OK
    return await run_in_threadpool(stored_job_out, request.app.state.engine, job)
