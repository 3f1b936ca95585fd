"""Results of eval, predict and export jobs: metrics, generated predictions, the exported model."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from tunedeck.api.answers import errors
from tunedeck.schemas import FileOut
from tunedeck.services.jobs import results as service
from tunedeck.services.jobs.records import get_job
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api/jobs", tags=["results"])
MAX_ROWS = 200


class ResultRow(BaseModel):
    split: str = Field(description="train, eval or predict: the results file it comes from")
    name: str = Field(description="the metric without its split prefix: loss, bleu-4, rouge-l, runtime, ...")
    value: float


class ExportOut(BaseModel):
    files: list[FileOut]
    total_bytes: int
    weights_bytes: int = Field(description="the merged model's weight files")
    base_weights_bytes: int | None = Field(description="the base model's weight files, when a local folder")
    adapter_weights_bytes: int | None


class ResultsOut(BaseModel):
    job_id: int
    kind: str
    metrics: list[ResultRow]
    predictions: int = Field(description="rows in generated_predictions.jsonl")
    export: ExportOut | None


class PredictionRow(BaseModel):
    index: int
    prompt: str
    label: str
    prediction: str


class PredictionPage(BaseModel):
    rows: list[PredictionRow]
    offset: int
    total: int


class PageQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")  # an unknown parameter is refused, not ignored

    offset: int = Field(0, ge=0, le=2**31)
    limit: int = Field(50, ge=1, le=MAX_ROWS)


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
