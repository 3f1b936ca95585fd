"""Local models: what the server can train without the hub, with the template each one needs."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from tunedeck.api.deps import SettingsDep, only_query
from tunedeck.schemas import ModelList, ModelOut
from tunedeck.services.assets import models as service

router = APIRouter(prefix="/api", tags=["checks"])


@router.get("/models", response_model=ModelList, dependencies=[only_query()])
async def list_models(settings: SettingsDep) -> ModelList:
    """Models in the allowed roots and the HF cache: architecture, parameters, dtype, template."""
    found = await run_in_threadpool(service.models, settings)  # reads folders and headers
    return ModelList(models=[ModelOut(**m) for m in found])
