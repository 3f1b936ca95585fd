"""A run's artifacts: any file of its output folder (with HTTP Range), or a set of them as one archive."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import FileResponse, StreamingResponse

from tunedeck.api.answers import Responses, errors
from tunedeck.api.deps import only_query
from tunedeck.services.jobs import artifacts
from tunedeck.services.jobs import records as service
from tunedeck.store.db import SessionDep

router = APIRouter(prefix="/api/jobs", tags=["artifacts"])
BINARY: Responses = {200: {"content": {"application/octet-stream": {}}, "description": "the bytes"}}


@router.get(
    "/{job_id}/files/{path:path}",
    response_class=FileResponse,
    responses={**BINARY, 206: {"description": "the requested range"}, **errors(404)},
)
def download_file(job_id: int, path: str, session: SessionDep) -> FileResponse:
    """One file of the job's output folder, streamed; a Range header gets that part (206)."""
    if "\x00" in path:  # no file name holds one (and the OS refuses it): bad input, not a missing file
        raise HTTPException(
            422,
            detail=[{"loc": ["path", "path"], "msg": "a NUL byte in the file path", "type": "value_error"}],
        )
    target = artifacts.one_file(service.get_job(session, job_id), path)
    return FileResponse(target, media_type="application/octet-stream", filename=target.name)


@router.get(
    "/{job_id}/archive",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"application/zip": {}, "application/x-tar": {}}, "description": "the archive"},
        **errors(404),
    },
    dependencies=[only_query("what", "format")],
)
def download_archive(
    job_id: int,
    session: SessionDep,
    what: Annotated[
        str,
        Query(
            pattern=r"^(adapter|output|checkpoint-\d{1,12})$",
            description="`adapter` (the saved adapter and tokenizer), `output` (everything), or `checkpoint-N`",
        ),
    ] = "adapter",
    format: Annotated[Literal["zip", "tar"], Query()] = "zip",
) -> StreamingResponse:
    """The adapter, a checkpoint or the whole output folder as one zip or tar, written as it streams."""
    base, files = artifacts.members(service.get_job(session, job_id), what)
    stream = artifacts.zip_stream(files) if format == "zip" else artifacts.tar_stream(files)
    return StreamingResponse(
        (chunk for chunk in stream if chunk),
        media_type="application/zip" if format == "zip" else "application/x-tar",
        headers={"Content-Disposition": f'attachment; filename="{base}.{format}"'},
    )
