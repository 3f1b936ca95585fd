"""The browser pages (frontend/, no build step), plotly.js from the installed package, and the
form's helpers: read a LLaMA-Factory YAML, preview the exact train.yaml a spec would run."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from tunedeck import runfiles
from tunedeck import spec as specs
from tunedeck.api import forms, report
from tunedeck.api.deps import NodeDep, SettingsDep
from tunedeck.api.responses import COMMON, ParsedYaml, PreviewOut, errors
from tunedeck.schemas import JobSpec
from tunedeck.services.report import PLOTLY_JS
from tunedeck.submission import resolve

# Inside the package, so an installed wheel (not only a checkout) serves the pages.
FRONTEND = Path(resources.files("tunedeck") / "frontend")
PAGES = {"/": "index.html", "/new": "new.html", "/compare": "compare.html", "/nodes": "nodes.html"}

router = APIRouter(prefix="/api/ui", tags=["ui"])


@router.post("/parse-yaml", response_model=ParsedYaml, responses=errors(413))
def parse_yaml(
    body: Annotated[str, Body(media_type="application/yaml", max_length=specs.MAX_YAML_BYTES)],
    settings: SettingsDep,
) -> dict:
    """A LLaMA-Factory train YAML as the form's fields: `config` and `deepspeed`."""
    config = specs.load_yaml(body, max_items=settings.spec_max_keys)
    return {"config": config, "deepspeed": config.pop("deepspeed", None)}


@router.post("/preview", response_model=PreviewOut, responses=errors(413))
def preview(spec: JobSpec, settings: SettingsDep, node: NodeDep) -> dict:
    """The train.yaml (and ds_config.json) this spec would run, with the same checks as submit."""
    checked = resolve(spec, settings, node).checked()
    run = Path("<run folder>")
    train_yaml, ds_config = checked.render(
        output_dir=runfiles.output_dir(run), ds_path=run / runfiles.DS_CONFIG
    )
    return {
        "train_yaml": train_yaml,
        "ds_config": ds_config,
        "gpus": checked.gpus,
        "warnings": checked.warnings,
    }


def _page(name: str):
    def serve() -> FileResponse:
        return FileResponse(FRONTEND / name, headers={"Cache-Control": "no-cache"})

    serve.__doc__ = f"The {name} page."
    return serve


def mount(app: FastAPI) -> None:
    """Pages at /, /new, /jobs/{id}, /jobs/{id}/chat, /compare, /nodes; static files under /static."""
    app.include_router(router, responses=COMMON)
    app.include_router(forms.router, responses=COMMON)
    app.include_router(report.router)  # declares its own (JSON) errors
    for path, name in PAGES.items():
        app.add_api_route(path, _page(name), include_in_schema=False)
    job_page = _page("job.html")

    def job(job_id: int) -> FileResponse:
        return job_page()

    def plotly_js() -> FileResponse:
        return FileResponse(PLOTLY_JS, headers={"Cache-Control": "max-age=86400"})

    def favicon() -> FileResponse:
        return FileResponse(
            FRONTEND / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
        )

    chat_page = _page("chat.html")

    def chat(job_id: int) -> FileResponse:
        return chat_page()

    app.add_api_route("/jobs/{job_id}", job, include_in_schema=False)
    app.add_api_route("/jobs/{job_id}/chat", chat, include_in_schema=False)
    app.add_api_route("/favicon.ico", favicon, include_in_schema=False)  # browsers ask for it unprompted
    app.add_api_route("/static/vendor/plotly.min.js", plotly_js, include_in_schema=False)
    app.mount("/static", StaticFiles(directory=FRONTEND), name="static")
