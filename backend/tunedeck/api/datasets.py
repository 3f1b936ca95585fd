"""Datasets: every dataset_info.json entry the server can see, with its file's size and rows."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from tunedeck.api.deps import SettingsDep, only_query
from tunedeck.checks import datasets as service
from tunedeck.schemas import DatasetList, DatasetOut

router = APIRouter(prefix="/api", tags=["checks"])


@router.get("/datasets", response_model=DatasetList, dependencies=[only_query()])
async def list_datasets(settings: SettingsDep) -> DatasetList:
    """Datasets the server has: each entry of each dataset_info.json in the allowed roots, with size and row count."""
    found = await run_in_threadpool(service.entries, settings)  # reads folders: off the event loop
    return DatasetList(datasets=[DatasetOut(**d) for d in found])
