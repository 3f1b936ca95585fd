"""Jobs side by side: what differs in their configs and where each ended."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from tunedeck.api.answers import errors
from tunedeck.api.deps import only_query
from tunedeck.problems import SpecError, detail
from tunedeck.schemas import CompareJob, CompareLast, CompareOut
from tunedeck.services.jobs import compare as service
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api", tags=["jobs"])
MAX_JOBS = 20


def job_ids(text: str) -> list[int]:
    """`1,2,3` as ids: two to MAX_JOBS distinct job ids (SpecError at query.jobs otherwise)."""
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        ids = []
    if not 2 <= len(ids) <= MAX_JOBS or len(set(ids)) != len(ids) or min(ids) < 1 or max(ids) > 2**62:
        raise SpecError(
            [detail(["query", "jobs"], f"two to {MAX_JOBS} distinct job ids, separated by commas (jobs=3,7)")]
        )
    return ids


@router.get("/compare", response_model=CompareOut, responses=errors(404), dependencies=[only_query("jobs")])
def compare_jobs(
    session: SessionDep,
    jobs: Annotated[str, Query(max_length=2000, description="job ids separated by commas: 3,7")],
) -> CompareOut:
    """Jobs side by side: the train.yaml keys that differ (whole values) and each job's last step, loss, eval loss, tokens/s."""
    rows, differ = service.compare(session, job_ids=job_ids(jobs))
    return CompareOut(
        jobs=[
            CompareJob(id=job.id, name=job.name, status=job.status, last=CompareLast(**last))
            for job, last in rows
        ],
        differ=differ,
    )
