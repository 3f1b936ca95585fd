"""Telemetry from runners: batches of metric points, log lines, memory samples and process states.

A batch comes as JSON (TelemetryBatch) or packed (tunedeck.contract.wire: memory samples as binary columns,
what runners send). Its answer comes once the batch is committed with the WAL synced to disk, so an
acknowledged batch survives a crash of the server or of the machine.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from typing import Annotated, Any, NamedTuple

from fastapi import APIRouter, Depends, Header, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from tunedeck.api.answers import errors
from tunedeck.contract import wire
from tunedeck.contract.protocol import TelemetryBatch
from tunedeck.schemas import Stored
from tunedeck.services.errors import NotFound
from tunedeck.services.ingest.devices import NotGiven
from tunedeck.services.ingest.writer import plain
from tunedeck.store.hashes import token_hash
from tunedeck.store.tables import JobStatus

router = APIRouter(prefix="/api/jobs", tags=["telemetry"])
JSON_TYPES = ("", "application/json")
STORE_WAIT_S = 60.0


def _refused(e: ValidationError) -> RequestValidationError:
    return RequestValidationError(
        [{"loc": ("body", *err["loc"]), "msg": err["msg"], "type": err["type"]} for err in e.errors()]
    )


async def batch_of(request: Request) -> dict[str, Any]:
    """The request's batch as the ingest writer takes it, from either encoding."""
    body = await request.body()
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if kind == wire.MEDIA_TYPE:
            batch, memory = wire.decode(body)
            out = plain(batch)
            out["memory"] = memory
            return out
        if kind in JSON_TYPES or kind.endswith("+json"):
            try:
                data = json.loads(body)
            except ValueError as e:
                loc = ("body", e.pos) if isinstance(e, json.JSONDecodeError) else ("body",)
                raise RequestValidationError(
                    [{"loc": loc, "msg": f"JSON decode error: {e}", "type": "json_invalid"}]
                ) from None
            return plain(TelemetryBatch.model_validate(data))
    except ValidationError as e:
        raise _refused(e) from None
    raise RequestValidationError(
        [
            {
                "loc": ("header", "content-type"),
                "msg": f"a batch is application/json or {wire.MEDIA_TYPE}, not {kind!r}",
                "type": "value_error",
            }
        ]
    )


def _inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """A model's JSON schema with its $defs put in place (the route takes no model parameter, so
    the OpenAPI document has no component for it to point at)."""
    defs = schema.pop("$defs", {})

    def walk(x: Any) -> Any:
        if isinstance(x, dict):
            if "$ref" in x:
                return walk(defs[x["$ref"].rsplit("/", 1)[-1]])
            return {k: walk(v) for k, v in x.items()}
        return [walk(v) for v in x] if isinstance(x, list) else x

    return walk(schema)


BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": _inlined(TelemetryBatch.model_json_schema())},
            wire.MEDIA_TYPE: {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


RUNNER_JOB = "SELECT status, runner_token_hash, gpus, nodes FROM jobs WHERE id = ?"


class RunnerJob(NamedTuple):
    status: JobStatus
    runner_token_hash: str | None
    gpus: int
    nodes: int


def runner_job(state: Any, job_id: int, authorization: str | None) -> RunnerJob:
    """The job's row (status, gpus, nodes) when `authorization` holds its runner's token; else 404 or 401."""
    # A few columns, plain SQL: no statement built and no ORM object per batch.
    with state.engine.connect() as conn:
        found = conn.exec_driver_sql(RUNNER_JOB, (job_id,)).first()
    if found is None:
        raise NotFound(f"job {job_id} not found")
    row = RunnerJob(JobStatus(found[0]), *found[1:])
    token = (authorization or "").removeprefix("Bearer ").strip()
    if row.status.finished:  # its token was revoked when it ended (rows from before then still hold one)
        raise HTTPException(
            status_code=401, detail=f"job {job_id} has ended: its runner token is no longer valid"
        )
    digest = token_hash(token)  # one hash, or one per rank where each node made its runner's (Ray)
    if not any(hmac.compare_digest(digest, h) for h in (row.runner_token_hash or "").split()):
        raise HTTPException(status_code=401, detail="this job's runner token is required")
    return row


def _check_runner(state: Any, job_id: int, authorization: str | None, batch: dict[str, Any]) -> None:
    """The job's runner token, and only devices the job was given (services.devices)."""
    row = runner_job(state, job_id, authorization)
    try:
        state.devices.admit(
            job_id=job_id,
            gpus=row.gpus,
            nodes=row.nodes,
            node=batch.get("node") or "",
            memory=batch.get("memory"),
        )
    except NotGiven as e:
        raise RequestValidationError([{"loc": e.loc, "msg": e.msg, "type": "value_error"}]) from None


@router.post(
    "/{job_id}/telemetry",
    response_model=Stored,
    response_model_exclude_none=True,  # `stacks` only once a dump was asked for
    responses=errors(404, 413),
    openapi_extra=BODY,
)
async def ingest(
    job_id: int,
    batch: Annotated[dict[str, Any], Depends(batch_of)],
    request: Request,
    authorization: Annotated[str | None, Header()] = None,
) -> dict:
    """Store a runner's batch (idempotent: items are keyed by their line numbers)."""
    await run_in_threadpool(_check_runner, request.app.state, job_id, authorization, batch)
    # Awaited here, not in a worker thread: a slow commit holds no thread of the pool, whatever the
    # number of runners. Shielded: a runner that hangs up leaves its batch to be stored all the same.
    stored = asyncio.wrap_future(request.app.state.writer.submit(job_id, batch))
    await asyncio.wait_for(asyncio.shield(stored), STORE_WAIT_S)
    # The newest stack-dump request rides on every answer: each node's runner dumps once per number.
    return {"stored": batch["seq"], "stacks": request.app.state.stacks.asked(job_id)}
