"""Checks before launch: lint and VRAM estimate of a job spec; predicted against measured after it."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request
from pydantic import Field

from tunedeck.api.deps import SettingsDep
from tunedeck.api.responses import Calibration, LintOut, errors
from tunedeck.db import SessionDep
from tunedeck.estimate import EstimateError
from tunedeck.models import JobSpec
from tunedeck.services import checks as service
from tunedeck.services.jobs import get_job

router = APIRouter(prefix="/api", tags=["checks"])


class EstimateRequest(JobSpec):
    device_total_bytes: int | None = Field(
        None, gt=0, description="memory of one device; default: this node's smallest GPU (none on a CPU node)"
    )


@router.post("/lint", response_model=LintOut, responses=errors(413))
def lint_spec(spec: JobSpec, request: Request, settings: SettingsDep) -> dict[str, list[dict[str, Any]]]:
    """Lint findings of a job spec (what a submission would refuse or warn about)."""
    return {
        "findings": service.lint_spec(
            spec,
            settings=settings,
            node_gpus=request.app.state.node_gpus,
            node_preflight=service.node_preflight(settings),
        )
    }


@router.post("/estimate", responses=errors(413))
def estimate_spec(body: EstimateRequest, request: Request, settings: SettingsDep) -> dict[str, Any]:
    """Per-GPU memory estimate of a job spec, with its breakdown in bytes."""
    spec = JobSpec(**body.model_dump(exclude={"device_total_bytes"}))
    try:
        return service.estimate_spec(
            spec,
            settings=settings,
            node_gpus=request.app.state.node_gpus,
            device_total_bytes=body.device_total_bytes
            or service.node_device_total(request.app.state.node_gpus),
        )
    except (service.NoModelConfig, EstimateError) as e:
        raise HTTPException(
            status_code=422,
            detail=[{"loc": ["config", "model_name_or_path"], "msg": str(e), "type": "estimate_error"}],
        ) from None


@router.get("/jobs/{job_id}/estimate", responses=errors(404))
def job_estimate(job_id: int, session: SessionDep) -> dict[str, Any]:
    """The job's stored estimate against its measured peak (recorded for calibration once it ends)."""
    return service.job_estimate(session, get_job(session, job_id))


@router.get("/estimates/calibration", response_model=list[Calibration])
def calibration(session: SessionDep) -> list[dict[str, Any]]:
    """Measured / predicted peak per GPU kind over finished jobs."""
    return service.calibration(session)
