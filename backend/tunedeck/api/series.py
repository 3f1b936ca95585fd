"""Chart data: a job's metric series from the chart tiles (`max_points`), zoomable by step, with its lineage."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tunedeck.api.answers import errors
from tunedeck.api.deps import SettingsDep
from tunedeck.schemas import SeriesOut
from tunedeck.services.charts import metrics as service
from tunedeck.services.jobs import records as jobs_service
from tunedeck.store.db import SessionDep, engine_of

router = APIRouter(prefix="/api/jobs", tags=["charts"])


@router.get("/{job_id}/series", response_model=SeriesOut, responses=errors(404))
def get_series(
    job_id: int,
    session: SessionDep,
    settings: SettingsDep,
    max_points: Annotated[int | None, Query(ge=10, le=100_000)] = None,
    x0: Annotated[float | None, Query(description="first step of a zoomed window")] = None,
    x1: Annotated[float | None, Query(description="last step of a zoomed window")] = None,
    until: Annotated[
        int | None,
        Query(
            ge=0,
            le=2**62,
            description="history up to a stream cursor's m; rows stored after it may be in the answer, and "
            "`last_id` then names the newest, so a stream resumed from `last_id` repeats nothing",
        ),
    ] = None,
    lineage: Annotated[
        bool,
        Query(
            description="a resumed run's curves continued from the runs it resumed (parent_id), each "
            "point naming its job"
        ),
    ] = False,
) -> dict:
    """Loss, eval loss, lr, tokens/s and RECORD_VRAM peaks by step, extremes kept when downsampled; a resumed run's attempts as one curve with `lineage=1`."""
    jobs_service.get_job(session, job_id)
    return service.metric_series(
        engine_of(session),
        job_id=job_id,
        max_points=max_points or settings.chart_points,
        x0=x0,
        x1=x1,
        until=until,
        lineage=lineage,
    )
