"""The browser pages (frontend/, no build step), plotly.js (services/views/report.py picks the bundle), and
the form's helpers: read a LLaMA-Factory YAML, preview the exact train.yaml a spec would run."""

from __future__ import annotations

import hashlib
from importlib import resources
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Body, FastAPI
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.gzip import GZipMiddleware
from starlette.routing import Mount, Route, Router

from tunedeck.api import forms, report
from tunedeck.api.answers import COMMON, errors
from tunedeck.api.deps import NodeDep, SettingsDep
from tunedeck.checks import spec as specs
from tunedeck.checks.submission import resolve
from tunedeck.schemas import JobSpec, ParsedYaml, PreviewOut
from tunedeck.services.views.report import PLOTLY_JS

# Inside the package, so an installed wheel (not only a checkout) serves the pages.
FRONTEND = Path(str(resources.files("tunedeck.frontend")))
PAGES = {"/": "index.html", "/new": "new.html", "/compare": "compare.html", "/nodes": "nodes.html"}
PLOTLY_SRC = "/static/vendor/plotly.min.js"  # as the pages name it; served under a versioned URL
# A year, never revalidated: the URL changes with the bytes, so a second visit neither downloads the
# bundle nor compiles it again (the browser keeps its compiled code with the cached file).
IMMUTABLE = "public, max-age=31536000, immutable"
# gzip takes plotly's basic bundle from 1.19 MB to 0.40 MB in ~40 ms at level 6 (level 9: 1 KB less,
# a third slower); text under a kilobyte is not worth a second round of headers.
GZIP_LEVEL, GZIP_MIN_BYTES = 6, 1024

router = APIRouter(prefix="/api/ui", tags=["ui"])


class Revalidated(StaticFiles):
    """Our own modules and styles under fixed names: a browser asks again each visit (a 304 while its
    copy is current), so after an upgrade no page runs the old modules."""

    cache_control = "no-cache"

    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = self.cache_control
        return response


class Bundle(Revalidated):
    """plotly.js alone, under the URL the pages name it by: StaticFiles' ETag, Last-Modified and 304s,
    with the caching its URL allows."""

    def __init__(self, cache_control: str) -> None:
        super().__init__(directory=PLOTLY_JS.parent)
        self.cache_control = cache_control

    def get_path(self, scope) -> str:
        return PLOTLY_JS.name


def static_files(plotly_url: str) -> GZipMiddleware:
    """Everything under /static, gzipped for a browser that accepts it (Starlette's middleware; only
    here, so no event stream or download of the API passes through it)."""
    routes = [  # paths as the mount sees them
        Route(plotly_url.removeprefix("/static"), Bundle(IMMUTABLE)),  # the URL changes with the bytes
        Route(PLOTLY_SRC.removeprefix("/static"), Bundle("no-cache")),  # a page saved before it had one
        Mount("", Revalidated(directory=FRONTEND)),
    ]
    return GZipMiddleware(Router(routes), minimum_size=GZIP_MIN_BYTES, compresslevel=GZIP_LEVEL)


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
    train_yaml, ds_config = checked.render(run_dir=Path("<run folder>"))
    return {
        "train_yaml": train_yaml,
        "ds_config": ds_config,
        "gpus": checked.gpus,
        "warnings": checked.warnings,
    }


def _plotly_url() -> str:
    return f"/static/vendor/{hashlib.sha256(PLOTLY_JS.read_bytes()).hexdigest()[:16]}/plotly.min.js"


def _page(name: str, plotly_url: str):
    def serve() -> HTMLResponse:
        text = (FRONTEND / name).read_text().replace(PLOTLY_SRC, plotly_url)
        return HTMLResponse(text, headers={"Cache-Control": "no-cache"})

    serve.__doc__ = f"The {name} page."
    return serve


def mount(app: FastAPI) -> None:
    """Pages at /, /new, /jobs/{id}, /jobs/{id}/chat, /compare, /nodes; static files under /static."""
    app.include_router(router, responses=COMMON)
    app.include_router(forms.router, responses=COMMON)
    app.include_router(report.router)  # declares its own (JSON) errors
    plotly_url = _plotly_url()
    for path, name in PAGES.items():
        app.add_api_route(path, _page(name, plotly_url), include_in_schema=False)
    job_page = _page("job.html", plotly_url)

    def job(job_id: int) -> HTMLResponse:
        return job_page()

    def favicon() -> FileResponse:
        return FileResponse(
            FRONTEND / "favicon.svg", media_type="image/svg+xml", headers={"Cache-Control": "max-age=86400"}
        )

    chat_page = _page("chat.html", plotly_url)

    def chat(job_id: int) -> HTMLResponse:
        return chat_page()

    app.add_api_route("/jobs/{job_id}", job, include_in_schema=False)
    app.add_api_route("/jobs/{job_id}/chat", chat, include_in_schema=False)
    app.add_api_route("/favicon.ico", favicon, include_in_schema=False)  # browsers ask for it unprompted
    app.mount("/static", static_files(plotly_url), name="static")
