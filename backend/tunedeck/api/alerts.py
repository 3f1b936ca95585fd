"""Alerts: per job, and team-wide."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from tunedeck.api.answers import errors
from tunedeck.schemas import AlertOut, TeamFilter
from tunedeck.services.alerting import reconcile as service
from tunedeck.store.db import SessionDep

JobId = Annotated[int, Path(ge=0, le=2**62, description="job id")]
router = APIRouter(prefix="/api", tags=["alerts"])
Cursor = Annotated[int | None, Query(ge=0, le=2**62, description="an alert id: only alerts after it")]


@router.get("/jobs/{job_id}/alerts", response_model=list[AlertOut], responses=errors(404))
def job_alerts(
    job_id: JobId, session: SessionDep, open: bool | None = None, after: Cursor = None
) -> list[AlertOut]:
    """A job's alerts, oldest first, with the evidence and what to change."""
    rows = service.list_alerts(session, job_id=job_id, open_only=open, after=after)
    return [AlertOut.model_validate(r, from_attributes=True) for r in rows]


@router.get("/alerts", response_model=list[AlertOut])
def all_alerts(session: SessionDep, q: Annotated[TeamFilter, Query()]) -> list[AlertOut]:
    """Alerts of every job (`open=true`: the conditions that hold now; `open=false`: past ones)."""
    rows = service.list_alerts(
        session,
        open_only=q.open,
        after=q.after,
        min_severity=q.min_severity,
        newest_first=q.order == "desc",
        limit=q.limit,
    )
    return [AlertOut.model_validate(r, from_attributes=True) for r in rows]
