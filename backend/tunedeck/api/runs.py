"""Runs from outside tunedeck: a LLaMA-Factory output folder's files, stored as a finished job."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, HTTPException, Request, UploadFile, status
from starlette.concurrency import run_in_threadpool

from tunedeck.alerts.rundir import BadInput
from tunedeck.api.deps import SettingsDep, principal_name
from tunedeck.api.responses import errors
from tunedeck.schemas import NAME_RULES, JobOut
from tunedeck.services.alerting.summary import stored_job_out
from tunedeck.services.jobs.imports import import_run

router = APIRouter(prefix="/api/runs", tags=["runs"])


async def _text(f: UploadFile | None, field: str) -> str | None:
    if f is None:
        return None
    try:
        return (await f.read()).decode()
    except UnicodeDecodeError:
        raise HTTPException(
            422, detail=[{"loc": ["body", field], "msg": "not UTF-8 text", "type": "value_error"}]
        ) from None


@router.post("/import", status_code=status.HTTP_201_CREATED, response_model=JobOut, responses=errors(413))
async def import_run_route(
    request: Request,
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
    """Store an outside run as a finished job with its loss and memory charts and its alerts."""
    texts = {
        k: await _text(f, k)
        for k, f in (("trainer_log", trainer_log), ("memory", memory), ("config", config), ("log", log))
    }
    try:
        job = await run_in_threadpool(
            import_run,
            request.app.state.engine,
            settings=settings,
            name=name,
            trainer_log=texts["trainer_log"] or "",
            memory_csv=texts["memory"],
            config=texts["config"],
            log_text=texts["log"],
            owner=principal_name(request),
            state=request.app.state.jobstate,
        )
    except BadInput as e:
        raise HTTPException(422, detail=[{"loc": ["body"], "msg": str(e), "type": "value_error"}]) from None
    return await run_in_threadpool(stored_job_out, request.app.state.engine, job)
