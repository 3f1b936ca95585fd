"""Checks before launch: lint and VRAM estimate of a job spec; predicted against measured after it."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from fastapi import APIRouter, HTTPException

from tunedeck.api.answers import errors
from tunedeck.api.deps import NodeDep, SettingsDep
from tunedeck.checks.submission import resolve
from tunedeck.schemas import Calibration, Estimate, EstimateRequest, JobEstimate, JobSpec, LintOut
from tunedeck.services.charts import estimates as service
from tunedeck.services.jobs.records import get_job
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api", tags=["checks"])


@router.post("/lint", response_model=LintOut, responses=errors(413))
def lint_spec(spec: JobSpec, settings: SettingsDep, node: NodeDep) -> dict[str, list[dict[str, Any]]]:
    """Lint findings of a job spec (what a submission would refuse or warn about)."""
    return {"findings": resolve(spec, settings, node).findings}


@router.post("/estimate", response_model=Estimate, responses=errors(413))
def estimate_spec(body: EstimateRequest, settings: SettingsDep, node: NodeDep) -> dict[str, Any]:
    """Per-GPU memory estimate of a job spec, with its breakdown in bytes."""
    if body.device_total_bytes:
        node = replace(node, device_total_bytes=body.device_total_bytes)
    found = resolve(JobSpec(**body.model_dump(exclude={"device_total_bytes"})), settings, node)
    if found.estimate is None:
        raise HTTPException(status_code=422, detail=found.estimate_errors)
    return found.estimate


@router.get("/jobs/{job_id}/estimate", response_model=JobEstimate, responses=errors(404))
def job_estimate(job_id: int, session: SessionDep) -> dict[str, Any]:
    """The job's stored estimate against its measured peak (recorded for calibration once it ends)."""
    return service.job_estimate(session, get_job(session, job_id))


@router.get("/estimates/calibration", response_model=list[Calibration])
def calibration(session: SessionDep) -> list[dict[str, Any]]:
    """Measured / predicted peak per GPU kind over finished jobs."""
    return service.calibration(session)
