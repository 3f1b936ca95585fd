"""Telemetry from runners: batches of metric points, log lines, memory samples and process states."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import APIRouter, Header, HTTPException, Request

from tunedeck.api.responses import Stored, errors
from tunedeck.db import SessionDep
from tunedeck.protocol import TelemetryBatch
from tunedeck.scheduler import token_hash
from tunedeck.services import jobs as service
from tunedeck.services.ingest import plain

router = APIRouter(prefix="/api/jobs", tags=["telemetry"])


@router.post("/{job_id}/telemetry", response_model=Stored, responses=errors(404, 413))
def ingest(
    job_id: int,
    batch: TelemetryBatch,
    request: Request,
    session: SessionDep,
    authorization: Annotated[str | None, Header()] = None,
) -> dict:
    """Store a runner's batch (idempotent: items are keyed by their line numbers)."""
    job = service.get_job(session, job_id)
    token = (authorization or "").removeprefix("Bearer ").strip()
    if job.status.finished:  # its token was revoked when it ended (rows from before then still hold one)
        raise HTTPException(
            status_code=401, detail=f"job {job_id} has ended: its runner token is no longer valid"
        )
    if not job.runner_token_hash or not hmac.compare_digest(token_hash(token), job.runner_token_hash):
        raise HTTPException(status_code=401, detail="this job's runner token is required")
    session.close()  # the writer thread does the writing
    request.app.state.writer.submit(job_id, plain(batch)).result(timeout=60)
    return {"stored": batch.seq}
