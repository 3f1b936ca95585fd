"""A job's memory series (VRAM per GPU, or host memory of its process tree on a CPU node)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query

from tunedeck.api.answers import errors
from tunedeck.api.deps import SettingsDep
from tunedeck.contract.protocol import NODE_PATTERN
from tunedeck.schemas import MemoryPage, MemorySampleOut
from tunedeck.services.charts import memory as service
from tunedeck.store.db import SessionDep

JobId = Annotated[int, Path(ge=0, le=2**62, description="job id")]
router = APIRouter(prefix="/api/jobs", tags=["memory"])


@router.get("/{job_id}/memory", response_model=MemoryPage, responses=errors(404))
def get_memory(
    job_id: JobId,
    session: SessionDep,
    settings: SettingsDep,
    gpu: Annotated[int | None, Query(ge=-1, le=1_000_000, description="one device; -1 = host memory")] = None,
    node: Annotated[
        str | None,
        Query(
            max_length=253, pattern=NODE_PATTERN, description="one node's devices (a job on several nodes)"
        ),
    ] = None,
    after: Annotated[
        int | None, Query(ge=0, le=2**62, description="cursor from the previous page's `next`")
    ] = None,
    max_points: Annotated[
        int | None,
        Query(
            ge=3, le=100000, description="downsample each GPU to about this many points, keeping every peak"
        ),
    ] = None,
    t0: Annotated[float | None, Query(description="window start, unix seconds")] = None,
    t1: Annotated[float | None, Query(description="window end, unix seconds")] = None,
    limit: Annotated[int | None, Query(ge=1, le=2**62)] = None,
) -> MemoryPage:
    """Memory samples after a cursor, optionally of one node, in a window and downsampled per device."""
    rows, nxt, reduced = service.memory_page(
        session,
        job_id=job_id,
        node=node,
        gpu=gpu,
        after=after,
        max_points=max_points,
        t0=t0,
        t1=t1,
        limit=min(limit or settings.page_limit, settings.page_limit_max),
    )
    return MemoryPage(
        samples=[MemorySampleOut.model_validate(r, from_attributes=True) for r in rows],
        next=nxt,
        downsampled=reduced,
        gpus=service.gpus_of(session, job_id, node),
    )
