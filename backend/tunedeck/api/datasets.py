"""Datasets: every dataset_info.json entry the server can see, registering one (an upload or a file
inside the roots), and a preview of its rows with the chat template applied.

The router's body limit is TUNEDECK_DATASET_MAX_BYTES plus room for the form's other fields
(main.py includes it so): an upload streams to a file, never into one JSON body.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, File, Form, HTTPException, Query, UploadFile, status
from starlette.concurrency import run_in_threadpool

from tunedeck.api.answers import TOO_LARGE, Responses, errors
from tunedeck.api.deps import SettingsDep, only_query
from tunedeck.checks import datasets as service
from tunedeck.problems import SpecError, detail
from tunedeck.schemas import DatasetAdded, DatasetList, DatasetOut, DatasetRendered
from tunedeck.services.assets import preview as previews
from tunedeck.services.assets import register

router = APIRouter(prefix="/api", tags=["checks"])
FORM_ROOM = 1 << 20  # bytes of a multipart body that are not the file: boundaries, headers, fields
ADDED: Responses = {
    **errors(409),
    413: {**TOO_LARGE, "description": "the file is larger than TUNEDECK_DATASET_MAX_BYTES"},
}


@router.get("/datasets", response_model=DatasetList, dependencies=[only_query()])
async def list_datasets(settings: SettingsDep) -> DatasetList:
    """Datasets the server has: each entry of each dataset_info.json in the allowed roots, with size and row count."""
    found = await run_in_threadpool(service.entries, settings)  # reads folders: off the event loop
    return DatasetList(datasets=[DatasetOut(**d) for d in found])


@router.post(
    "/datasets",
    status_code=status.HTTP_201_CREATED,
    response_model=DatasetAdded,
    responses=ADDED,
    dependencies=[only_query()],
)
async def add_dataset(
    settings: SettingsDep,
    name: Annotated[str, Form(min_length=1, max_length=100, description="the name a job's `dataset` gives")],
    file: Annotated[UploadFile | None, File(description="JSON, JSONL, CSV or Parquet")] = None,
    path: Annotated[str | None, Form(max_length=4096, description="a file inside the allowed roots")] = None,
    dataset_dir: Annotated[
        str | None, Form(max_length=4096, description="the folder whose dataset_info.json gets the entry")
    ] = None,
) -> DatasetAdded:
    """Register a dataset (an upload or a file inside the roots): its format is detected and every row checked."""
    if (file is None) == (path is None):
        raise SpecError([detail(["body", "file"], "give either a file to upload or a `path`, not both")])
    try:
        if file is not None:
            added = await run_in_threadpool(
                register.add_upload,
                name=name,
                filename=file.filename or "",
                data=file.file,
                dataset_dir=dataset_dir,
                settings=settings,
            )
        else:
            assert path is not None  # one of the two, checked above
            added = await run_in_threadpool(
                register.add_path, name=name, path=path, dataset_dir=dataset_dir, settings=settings
            )
    except register.TooLarge as e:
        raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, detail=str(e)) from None
    return DatasetAdded(**added)


@router.get(
    "/datasets/{name}/preview",
    response_model=DatasetRendered,
    responses=errors(404),
    dependencies=[only_query("model", "template", "cutoff_len", "rows", "dataset_dir")],
)
async def preview_dataset(
    settings: SettingsDep,
    name: str,
    model: Annotated[
        str, Query(min_length=1, max_length=4096, description="a model folder or cached hub id")
    ],
    template: Annotated[str | None, Query(max_length=100, description="default: the model's own")] = None,
    cutoff_len: Annotated[int, Query(ge=1, le=1 << 20)] = 2048,
    rows: Annotated[int, Query(ge=1, le=20)] = 3,
    dataset_dir: Annotated[str | None, Query(max_length=4096)] = None,
) -> DatasetRendered:
    """The first rows as the model sees them (LLaMA-Factory's chat template applied), tokens against cutoff_len."""
    found = await run_in_threadpool(
        previews.preview,
        name=name,
        model=model,
        template=template,
        cutoff_len=cutoff_len,
        rows=rows,
        dataset_dir=dataset_dir,
        settings=settings,
    )
    return DatasetRendered(**found)
