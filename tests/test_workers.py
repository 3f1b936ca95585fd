"""The background threads share one Worker loop, and the lifespan starts and stops all of them."""

from __future__ import annotations

import logging
import os
import threading

import psutil
from sqlalchemy import text

from tests.utils.factories import running_job_database
from tests.utils.wait import until
from tunedeck.config import Settings
from tunedeck.services.ingest.retention import Retention
from tunedeck.services.ingest.storage import IntegrityCheck, StorageHealth
from tunedeck.services.ingest.upkeep import StoreSurvey
from tunedeck.services.ingest.writer import IngestWriter
from tunedeck.store.db import make_engine, upgrade
from tunedeck.workers import Worker


class Counter(Worker):
    """Fails its first pass; passes come only from wake() (the interval is an hour)."""

    name = "counter"
    interval_s = 3600.0

    def __init__(self) -> None:
        super().__init__()
        self.passes = 0

    def run_once(self) -> None:
        self.passes += 1
        if self.passes == 1:
            raise ValueError("a bad row")


def test_a_failing_pass_is_logged_and_the_next_one_still_runs(caplog):
    w = Counter()
    with caplog.at_level(logging.ERROR, logger="tunedeck.workers"):
        w.start()
        until(lambda: w.passes == 1, "the first pass")
        w.wake()
        until(lambda: w.passes == 2, "a pass after wake()")
        w.stop()
    assert not any(t.name == "counter" for t in threading.enumerate())
    (rec,) = caplog.records
    assert "counter: pass failed" in rec.getMessage() and rec.exc_info[0] is ValueError
    w.wake()  # its thread is gone: nothing runs any more
    assert w.passes == 2


def test_the_writer_stores_every_batch_handed_over_before_stop(tmp_path):
    engine = running_job_database(tmp_path / "t.db")
    writer = IngestWriter(engine)
    writer.start()
    futures = [
        writer.submit(1, {"seq": i, "logs": [{"line": i, "t": 1.0 + i, "stream": "stdout", "text": "x"}]})
        for i in range(20)
    ]
    writer.stop()  # the final pass stores what was queued: no request is left waiting
    assert all(f.done() and f.exception() is None for f in futures)
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM log_lines")).scalar() == 20


def test_retention_is_its_own_worker(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at,"
                " finished_at) VALUES (1, 'j', 'succeeded', 1, '{}', '', '', '', :e, :e)"
            ),
            {"e": "2026-01-01 00:00:00"},
        )
        c.execute(
            text("INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes) VALUES (1, :i, :t, 0, :v)"),
            [{"i": i, "t": 1000.0 + i, "v": (i % 7) << 30} for i in range(600)],
        )
    off = Retention(engine, Settings(workspace=tmp_path, memory_raw_retention_days=None))
    off.run_once()  # retention is off
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM memory_samples")).scalar() == 600
    on = Retention(engine, Settings(workspace=tmp_path, memory_raw_retention_days=1, retention_check_s=7))
    assert (on.interval_s, on.delay_s) == (7, 60)
    on.run_once()
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM memory_samples")).scalar() < 600
        # the charts' tiles still count every sample
        assert (
            c.execute(
                text("SELECT sum(n) FROM chart_tiles WHERE series = 'memory.0' AND level = 12")
            ).scalar()
            == 600
        )


def test_the_lifespan_starts_every_worker_and_stops_them_all(app_factory):
    app = app_factory()
    state = app.app.state
    workers = state.workers
    assert [w.name for w in workers] == [
        "webhooks",
        "alert-engine",
        "ingest-writer",
        "scheduler",
        "retention",
        "store-upkeep",
        "store-survey",
        "chat-idle",
        "auto-resume",
        "integrity-check",
    ]
    assert workers[:4] == [state.notifier, state.alerts, state.writer, state.scheduler]
    # One notifier, held by the app and handed to those that tell of alerts and ends (no module global).
    assert state.jobstate.notifier is state.notifier and state.jobstate.alerts is state.alerts
    assert state.writer.state is state.jobstate and state.scheduler.state is state.jobstate
    threads = [w._thread for w in workers]
    assert all(t is not None and t.is_alive() for t in threads)
    app.stop()
    assert not any(t.is_alive() for t in threads)


def test_the_files_transport_adds_the_outbox_reader_before_the_scheduler(app_factory):
    """Up before the scheduler's first pass (which replays outboxes of runners gone), fed by no route."""
    app = app_factory(TUNEDECK_RUNNER_TRANSPORT="files")
    names = [w.name for w in app.app.state.workers]
    assert names.index("outbox-reader") == names.index("scheduler") - 1, names
    reader = app.app.state.workers[names.index("outbox-reader")]
    assert reader.writer is app.app.state.writer and reader._thread.is_alive()
    app.stop()


def _priorities(thread: threading.Thread) -> tuple[int, int]:
    """(nice, I/O class) of a live thread, as Linux keeps them per thread."""
    assert thread.native_id is not None
    return os.getpriority(os.PRIO_PROCESS, thread.native_id), psutil.Process(
        thread.native_id
    ).ionice().ioclass


def test_the_workers_that_read_the_whole_file_run_at_the_lowest_priorities_and_the_others_keep_theirs(
    tmp_path,
):
    """The full check and the page survey read every page beside serving: on a store larger than the
    machine's memory they took a core and the disk for minutes while ingest fell behind."""
    engine = running_job_database(tmp_path / "t.db")
    engine.dispose()
    health = StorageHealth(tmp_path, tmp_path / "t.db")
    check = IntegrityCheck(tmp_path / "t.db", health)
    survey = StoreSurvey(tmp_path / "t.db", survey_s=0.2)
    plain = Counter()
    own = _priorities(threading.current_thread())
    for w in (check, survey, plain):
        w.start()
    try:
        until(lambda: check.state == "ok", "the full check done")
        until(lambda: survey.day is not None, "a survey done")
        for w in (check, survey):  # their threads live on, waiting for the next pass
            assert w._thread is not None and w._thread.is_alive()
            assert _priorities(w._thread) == (19, psutil.IOPRIO_CLASS_IDLE), w.name
        assert plain._thread is not None and _priorities(plain._thread) == own
        assert _priorities(threading.current_thread()) == own
    finally:
        for w in (check, survey, plain):
            w.stop()
