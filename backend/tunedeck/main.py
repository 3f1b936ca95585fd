"""App factory. The lifespan owns the background work: migrations, then the list of workers."""

from __future__ import annotations

import logging
import os
from contextlib import asynccontextmanager

from fastapi import FastAPI

from tunedeck import __version__
from tunedeck.api import alerts as alerts_api
from tunedeck.api import artifacts as artifacts_api
from tunedeck.api import (
    auth,
    checks,
    errors,
    guard,
    jobs,
    preflight,
    presets,
    prometheus,
    series,
    stream,
    system,
    telemetry,
    ui,
)
from tunedeck.api import chat as chat_api
from tunedeck.api import compare as compare_api
from tunedeck.api import datasets as datasets_api
from tunedeck.api import lifecycle as lifecycle_api
from tunedeck.api import memory as memory_api
from tunedeck.api import models as models_api
from tunedeck.api import nodes as nodes_api
from tunedeck.api import results as results_api
from tunedeck.api import runs as runs_api
from tunedeck.api import stacks as stacks_api
from tunedeck.api.answers import COMMON
from tunedeck.api.deps import node_of
from tunedeck.config import Settings, get_settings
from tunedeck.contract.strictjson import StrictJSONResponse
from tunedeck.scheduling import executors
from tunedeck.scheduling.scheduler import Scheduler
from tunedeck.services.alerting.engine import AlertEngine
from tunedeck.services.alerting.notify import Notifier
from tunedeck.services.ingest.devices import Devices
from tunedeck.services.ingest.outboxes import OutboxReader
from tunedeck.services.ingest.retention import Retention
from tunedeck.services.ingest.storage import IntegrityCheck, StorageHealth
from tunedeck.services.ingest.store_process import ProcessStore
from tunedeck.services.ingest.upkeep import StoreSurvey, StoreUpkeep
from tunedeck.services.ingest.writer import IngestWriter
from tunedeck.services.jobs.chat import ChatIdle
from tunedeck.services.jobs.jobstate import JobState
from tunedeck.services.jobs.resume import Resumer
from tunedeck.services.jobs.stacks import StackStore
from tunedeck.services.live.events import Broadcaster
from tunedeck.services.views.nodes import NodeInventory
from tunedeck.store.db import check_file, make_engine, upgrade
from tunedeck.store.tables import JobStatus
from tunedeck.telemetry import detect_gpus


def check_workspace(settings: Settings) -> None:
    """A clear error at start when the workspace cannot hold the database and run folders."""
    try:
        settings.runs_dir.mkdir(parents=True, exist_ok=True)
        probe = settings.workspace / ".write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise RuntimeError(f"workspace {settings.workspace} is not writable: {e.strerror or e}") from None


def create_app(settings: Settings | None = None, *, db_checked: bool = False) -> FastAPI:
    """The app; `db_checked`: the caller has just run `check_file` on the database (a quick_check reads
    every page, seconds on a long history: a start does it once)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        if why := auth.writes_are_safe(settings):
            raise RuntimeError(why)
        if warning := guard.reads_warning(settings):
            logging.getLogger("tunedeck").warning(warning)
        # Tokens, configs and training output are the team's own: new files 0600, folders 0700
        # (inherited by the runners and trainers this server starts).
        os.umask(0o077)
        check_workspace(settings)
        if not db_checked and (why := check_file(settings.db_path, deep=settings.integrity_check == "start")):
            raise RuntimeError(why)
        engine = make_engine(settings.db_path, busy_timeout_s=settings.db_busy_timeout_s)
        upgrade(engine)
        if settings.admin_token_file and (note := auth.ensure_admin(engine, settings.admin_token_file)):
            logging.getLogger("tunedeck").warning(note)
        node_gpus = settings.gpu_slots if settings.gpu_slots is not None else len(detect_gpus()[2])
        notifier = Notifier(settings, engine)
        # Live streams (a task on the event loop, not a thread): woken by the ingest writer after each
        # commit, by the alert engine when it opens an alert, and by their own watcher of job changes.
        events = app.state.events = Broadcaster(
            engine, poll_s=settings.stream_poll_s, team_every_s=settings.stream_team_every_s
        )

        # Stack dumps asked of the runners; a stall asks at once, so the dump shows the hang itself.
        stacks = app.state.stacks = StackStore(settings.workspace / "stacks")

        def alerts_opened(job, new) -> None:  # a page shows a new alert at once, not at the next watch
            events.notify({job.id})
            notifier.alerts_opened(job, new)
            if any(a.kind == "stall" for a in new) and job.status == JobStatus.running:
                stacks.request(job.id, reason="a stall alert opened")

        alerts = AlertEngine(engine, settings, on_new=alerts_opened)
        jobstate = JobState(
            engine, notifier=notifier, alerts=alerts
        )  # every status change, and who hears of it
        store = (
            ProcessStore(settings.db_path, jobstate, busy_timeout_s=settings.db_busy_timeout_s)
            if settings.ingest_process
            else None
        )
        # The newest full disk or damaged file met, for /api/health (told by the writer and the error handlers).
        storage = app.state.storage = StorageHealth(settings.db_path.parent, settings.db_path)
        writer = IngestWriter(engine, state=jobstate, store=store, health=storage)
        app.state.nodes = NodeInventory(engine, cache_s=settings.nodes_cache_s)
        app.state.devices = Devices(engine)  # what each job's runners may report (telemetry route)
        # By name from the registry: an executor's own dependencies (Ray) load only when it is chosen.
        executor = executors.build(settings.executor, settings, engine=engine, inventory=app.state.nodes)
        scheduler = Scheduler(
            settings=settings,
            engine=engine,
            executor=executor,
            writer=writer,
            state=jobstate,
            node_gpus=node_gpus,
            devices=app.state.devices,
        )
        # Every background thread, started in this order and stopped in reverse: each is up before
        # anything that feeds it (the scheduler's first pass reattaches runners and replays outboxes).
        idle = ChatIdle(engine=engine, settings=settings, executor=executor, state=jobstate)
        # A run its time limit stopped with a checkpoint is submitted again, checked against this node.
        resumer = Resumer(
            engine=engine, settings=settings, node=lambda: node_of(app.state), wake=scheduler.wake
        )
        survey = (
            StoreSurvey(settings.db_path, survey_s=settings.storage_survey_s)
            if settings.storage_survey_s
            else None
        )
        upkeep = app.state.upkeep = StoreUpkeep(
            settings.db_path, wal_limit_bytes=settings.wal_limit_bytes, survey=survey
        )
        retention = Retention(engine, settings, pruned=upkeep.wake)  # freed pages go back at once
        surveys = [survey] if survey is not None else []  # (TUNEDECK_STORAGE_SURVEY_S=0: never)
        workers = [notifier, alerts, writer, scheduler, retention, upkeep, *surveys, idle, resumer]
        if settings.integrity_check == "background":  # the whole file read beside serving, not before
            integrity = app.state.integrity = IntegrityCheck(settings.db_path, storage)
            workers.append(integrity)
        else:
            app.state.integrity = None
        if settings.runner_transport == "files":  # runners that cannot reach us: their outboxes, read here
            reader = OutboxReader(
                engine=engine, settings=settings, writer=writer, devices=app.state.devices, stacks=stacks
            )
            workers.insert(workers.index(scheduler), reader)
        app.state.settings, app.state.engine, app.state.node_gpus = settings, engine, node_gpus
        app.state.workers, app.state.jobstate = workers, jobstate
        app.state.notifier, app.state.alerts = notifier, alerts
        app.state.writer, app.state.executor, app.state.scheduler = writer, executor, scheduler
        writer.stored.append(alerts.tracker.take)  # the detectors fed in the writer's thread, no read back
        alerts.tracker.busy = writer.busy  # (and while it has batches in hand, only there)
        writer.listeners += [events.notify, alerts.notify]
        alerts.on_closed.append(events.notify)
        events.start()
        started = []
        try:
            for worker in workers:
                worker.start()
                started.append(worker)
            if node_gpus:  # a GPU node warms its preflight so submissions get hardware-aware lint
                from tunedeck.services.views.nodes import warm_preflight

                warm_preflight(settings)
            yield
        finally:
            await app.state.events.stop()
            for worker in reversed(started):
                worker.stop()
            engine.dispose()

    app = FastAPI(
        title="tunedeck",
        version=__version__,
        lifespan=lifespan,
        summary="Launch and monitor LLaMA-Factory fine-tunes",
        max_body_size=settings.max_body_bytes,  # 413 while the body streams in
        default_response_class=StrictJSONResponse,
    )  # never a NaN or Infinity token
    auth.install(app, settings)
    guard.install(app, settings)  # added last: runs first

    errors.install(app, settings)  # domain errors and bad input as clear answers, never a bare 500

    # FastAPI builds an included router's routes when a request first reaches it, trying routers in
    # order: the health check (what a starting server is asked first) comes before the rest.
    for module in (
        system,
        presets,
        jobs,
        lifecycle_api,
        artifacts_api,
        telemetry,
        stacks_api,
        stream,
        series,
        checks,
        preflight,
        alerts_api,
        memory_api,
        nodes_api,
        runs_api,
        results_api,
        compare_api,
        datasets_api,
        models_api,
        chat_api,
        prometheus,
    ):
        # An import's files and a dataset upload stream to disk: their routes have limits of their own.
        limit = {
            runs_api: settings.import_max_bytes,
            datasets_api: settings.dataset_max_bytes + datasets_api.FORM_ROOM,
        }.get(module)
        app.include_router(module.router, responses=COMMON, max_body_size=limit)
    ui.mount(app)  # the browser pages and their static files
    logging.getLogger("tunedeck").setLevel(logging.INFO)
    return app
