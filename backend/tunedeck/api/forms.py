"""The form's choices and help: LLaMA-Factory's help per key, its templates, the datasets of a
dataset_dir and their first rows, the template a model folder needs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request

from tunedeck.api.deps import SettingsDep
from tunedeck.checks import catalog
from tunedeck.schemas import DatasetPreview, DatasetsOut, HelpOut, ModelTemplates, TemplatesOut

router = APIRouter(prefix="/api/ui", tags=["ui"])
KEYS_MAX = 400


def only(*names: str):
    """A dependency that refuses query parameters other than `names` (a typo must not be ignored)."""

    def check(request: Request) -> None:
        extra = [k for k in request.query_params if k not in names]
        if extra:
            raise HTTPException(
                status_code=422,
                detail=[
                    {
                        "loc": ["query", k],
                        "msg": f"unknown parameter; known: {', '.join(names)}",
                        "type": "extra",
                    }
                    for k in extra
                ],
            )

    return Depends(check)


@contextmanager
def answered(key: str | None = None) -> Iterator[None]:
    """What cannot be offered, as a 422 at the query parameter (a name too long for the OS too)."""
    try:
        yield
    except catalog.CatalogError as e:
        loc = ["query", key or e.key]
        raise HTTPException(
            status_code=422, detail=[{"loc": loc, "msg": str(e), "type": "value_error"}]
        ) from None
    except OSError as e:
        loc = ["query", key or "dataset_dir"]
        msg = f"cannot be read: {e.strerror or e}"
        raise HTTPException(
            status_code=422, detail=[{"loc": loc, "msg": msg, "type": "value_error"}]
        ) from None


@router.get("/help", response_model=HelpOut, dependencies=[only("keys")])
def key_help(
    keys: Annotated[
        str | None, Query(max_length=20000, description="comma-separated; all when absent")
    ] = None,
) -> dict:
    """LLaMA-Factory's own help text, type, default and choices for train YAML keys."""
    names = None if keys is None else [k.strip() for k in keys.split(",") if k.strip()][:KEYS_MAX]
    return {"llamafactory_version": catalog.llamafactory_version(), "keys": catalog.key_help(names)}


@router.get("/templates", response_model=TemplatesOut, dependencies=[only()])
def templates() -> dict:
    """The chat templates LLaMA-Factory defines (any other name fails the run)."""
    return {
        "llamafactory_version": catalog.llamafactory_version(),
        "templates": catalog.templates(),
    }


@router.get("/datasets", response_model=DatasetsOut, dependencies=[only("dataset_dir")])
def datasets(
    settings: SettingsDep, dataset_dir: Annotated[str | None, Query(max_length=4096)] = None
) -> dict:
    """Dataset names that a dataset_dir's dataset_info.json defines (default: the workspace's data/)."""
    with answered():
        folder = catalog.dataset_folder(dataset_dir, settings)
        return {"dataset_dir": str(folder), "datasets": sorted(catalog.dataset_info(folder))}


@router.get(
    "/dataset-preview", response_model=DatasetPreview, dependencies=[only("dataset_dir", "name", "rows")]
)
def dataset_preview(
    settings: SettingsDep,
    name: Annotated[str, Query(min_length=1, max_length=512)],
    dataset_dir: Annotated[str | None, Query(max_length=4096)] = None,
    rows: Annotated[int, Query(ge=1, le=20)] = 3,
) -> dict:
    """The first rows of a dataset that dataset_info.json registers (files inside the allowed roots)."""
    with answered():
        return catalog.preview(dataset_dir, name, settings, rows=rows)


@router.get("/model-templates", response_model=ModelTemplates, dependencies=[only("model")])
def model_templates(
    settings: SettingsDep, model: Annotated[str, Query(min_length=1, max_length=4096)]
) -> dict:
    """The templates a model needs, from its config.json (a folder inside the roots or a cached hub id)."""
    with answered("model"):
        return catalog.model_templates(model, settings)
