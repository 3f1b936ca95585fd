"""App factory. The lifespan owns the background work: migrations, ingest writer, scheduler."""

from __future__ import annotations

import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from tunedeck import __version__, gpus
from tunedeck.api import jobs, system, telemetry
from tunedeck.config import Settings, get_settings
from tunedeck.db import make_engine, upgrade
from tunedeck.executors.local import LocalExecutor
from tunedeck.scheduler import Scheduler
from tunedeck.services.ingest import IngestWriter
from tunedeck.services.jobs import Conflict, NotFound
from tunedeck.spec import SpecError


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):  # noqa: ANN202
        settings.workspace.mkdir(parents=True, exist_ok=True)
        settings.runs_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(settings.db_path)
        upgrade(engine)
        node_gpus = settings.gpu_slots if settings.gpu_slots is not None else len(gpus.detect())
        writer = IngestWriter(engine)
        executor = LocalExecutor(settings)
        scheduler = Scheduler(settings=settings, engine=engine, executor=executor, writer=writer,
                              node_gpus=node_gpus)
        app.state.settings, app.state.engine, app.state.node_gpus = settings, engine, node_gpus
        app.state.writer, app.state.executor, app.state.scheduler = writer, executor, scheduler
        writer.start()
        scheduler.start()  # its first pass reattaches to the runners of jobs that were running
        try:
            yield
        finally:
            scheduler.stop()
            writer.stop()
            engine.dispose()

    app = FastAPI(title="tunedeck", version=__version__, lifespan=lifespan,
                  summary="Launch and monitor LLaMA-Factory fine-tunes")

    @app.exception_handler(SpecError)
    async def _spec_error(_: Request, e: SpecError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": e.errors})

    @app.exception_handler(NotFound)
    async def _not_found(_: Request, e: NotFound) -> JSONResponse:
        return JSONResponse(status_code=404, content={"detail": str(e)})

    @app.exception_handler(Conflict)
    async def _conflict(_: Request, e: Conflict) -> JSONResponse:
        return JSONResponse(status_code=409, content={"detail": str(e)})

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError) -> JSONResponse:
        # Field and reason only: echoing the input back could be large.
        errors = [{"loc": list(err.get("loc", ())), "msg": err.get("msg"), "type": err.get("type")}
                  for err in e.errors()]
        return JSONResponse(status_code=422, content={"detail": errors})

    for module in (jobs, telemetry, system):
        app.include_router(module.router)
    logging.getLogger("tunedeck").setLevel(logging.INFO)
    return app
