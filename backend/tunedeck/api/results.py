"""Results of eval, predict and export jobs: metrics, generated predictions, the exported model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tunedeck.api.answers import errors
from tunedeck.schemas import ExportOut, PageQuery, PredictionPage, PredictionRow, ResultRow, ResultsOut
from tunedeck.services.jobs import results as service
from tunedeck.services.jobs.records import get_job
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api/jobs", tags=["results"])


@router.get("/{job_id}/results", response_model=ResultsOut, responses=errors(404))
def get_results(job_id: int, session: SessionDep) -> ResultsOut:
    """Metrics of a finished job (eval loss, BLEU/ROUGE, runtime), and an export's files and size."""
    job = get_job(session, job_id)
    _, total = service.predictions(job, offset=0, limit=0)
    return ResultsOut(
        job_id=job.id,
        kind=job.kind,
        metrics=[ResultRow(**r) for r in service.metrics(job)],
        predictions=total,
        export=ExportOut(**e) if (e := service.export_summary(job)) else None,
    )


@router.get("/{job_id}/predictions", response_model=PredictionPage, responses=errors(404))
def get_predictions(job_id: int, session: SessionDep, page: Annotated[PageQuery, Query()]) -> PredictionPage:
    """A predict job's generations beside their prompts and labels, a page at a time."""
    rows, total = service.predictions(get_job(session, job_id), offset=page.offset, limit=page.limit)
    return PredictionPage(rows=[PredictionRow(**r) for r in rows], offset=page.offset, total=total)
