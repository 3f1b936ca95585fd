"""The server stores runners' telemetry in a process of its own: a real server, a real runner (with the
stand-in trainer), and the store process killed, signalled and orphaned for real."""

from __future__ import annotations

import json
import signal
import threading
from http.server import HTTPServer
from pathlib import Path

import psutil

from tests.utils.servers import demo_config, free_port
from tests.utils.standin import release, training_env
from tests.utils.wait import until
from tests.utils.webhooks import Receiver

STORE = "tunedeck.services.ingest.store_process"


def store_of(server) -> psutil.Process | None:
    """The server's live store process, if it has one."""
    for p in psutil.Process(server.proc.pid).children():
        try:
            if any(STORE in part for part in p.cmdline()) and p.status() != psutil.STATUS_ZOMBIE:
                return p
        except psutil.NoSuchProcess:
            continue
    return None


def gone(p: psutil.Process) -> bool:
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def lines(server, job_id: int) -> list[str]:
    return [g["text"] for g in server.all(job_id, "logs")]


def test_a_store_process_that_dies_is_replaced_and_the_job_ends_told_by_the_server(
    server_factory, assets, tmp_path
):
    Receiver.got = []
    hooks = HTTPServer(("127.0.0.1", free_port()), Receiver)
    threading.Thread(target=hooks.serve_forever, daemon=True).start()
    server = server_factory(
        TUNEDECK_GPU_SLOTS="0",
        TUNEDECK_TRAIN_PYTHON=str(training_env(tmp_path / "env")),
        TUNEDECK_WEBHOOK_URLS=json.dumps([f"http://127.0.0.1:{hooks.server_port}/hook"]),
    )
    try:
        job = server.submit({"name": "held", "config": demo_config(assets), "gpus": 0})
        server.wait(job["id"], ("running",))
        # Started with the runner, before its first batch; the first lines go through it.
        first = until(lambda: store_of(server), "the server's store process")
        until(lambda: "first line" in lines(server, job["id"]), "the runner's first line stored")

        first.kill()  # the next batch starts another
        until(lambda: gone(first), "the killed store process to end")
        release(Path(job["run_dir"]))
        done = server.wait(job["id"], ("succeeded",))
        second = store_of(server)
        assert second is not None and second.pid != first.pid
        # The runner's exit report was stored by the new store process; the end was told by the server:
        # its webhook, once.
        assert done["exit_code"] == 0
        assert "last line" in lines(server, job["id"])
        ends = until(
            lambda: [g for g in Receiver.got if g["event"] == "job_finished" and g["job_id"] == job["id"]],
            "the job's end webhook",
        )
        assert len(ends) == 1 and ends[0]["status"] == "succeeded"
    finally:
        hooks.shutdown()


def test_the_store_process_ignores_sigterm_and_ends_with_the_server_even_a_killed_one(
    server_factory, assets, tmp_path
):
    server = server_factory(TUNEDECK_GPU_SLOTS="0", TUNEDECK_TRAIN_PYTHON=str(training_env(tmp_path / "env")))
    job = server.submit({"name": "held", "config": demo_config(assets), "gpus": 0})
    until(lambda: "first line" in lines(server, job["id"]), "the runner's first line stored")
    store = store_of(server)
    assert store is not None
    store.send_signal(signal.SIGTERM)  # a terminal's Ctrl-C or a service stop reaches the whole group
    release(Path(job["run_dir"]))
    server.wait(job["id"], ("succeeded",))
    assert store_of(server).pid == store.pid  # the same process stored the rest

    server.kill()  # SIGKILL: no clean-up at all; the store sees its socket close and ends
    until(lambda: gone(store), "the store process of a killed server to end", timeout=60)


def test_the_store_process_fails_only_a_bad_batch_and_ends_when_idle(tmp_path):
    from sqlalchemy import text

    from tests.utils.factories import running_job_database
    from tunedeck.services.ingest.store_process import ProcessStore, StoreFailed
    from tunedeck.services.jobs.jobstate import JobState

    engine = running_job_database(tmp_path / "t.db")
    store = ProcessStore(tmp_path / "t.db", JobState(engine))
    memory = {"line": [0, 1], "t": [1.0, 2.0], "gpu": [0, 0], "used_bytes": [5, 7]}
    # Job 2 does not exist: its rows break the foreign key, in the child's transaction.
    store.send([(1, {"seq": 0, "memory": memory}), (2, {"seq": 0, "memory": memory})])
    stored = store.receive()
    pid = store.pid
    store.rest(idle_s=3600)  # not idle for that long: it stays
    assert store.pid == pid
    store.rest(idle_s=0)  # idle: it ends, and the next group starts another
    assert store.pid is None and not psutil.pid_exists(pid)
    store.send([(1, {"seq": 1, "memory": {**memory, "line": [2, 3]}})])
    assert store.receive().errors == [None] and store.pid not in (None, pid)
    store.close()
    ok, bad = stored.errors
    assert ok is None and isinstance(bad, StoreFailed) and "FOREIGN KEY" in str(bad)
    assert stored.before is None  # the group was stored batch by batch: no columns to feed from
    with engine.connect() as c:
        assert c.execute(text("SELECT job_id, line, used_bytes FROM memory_samples")).all() == [
            (1, 0, 5),
            (1, 1, 7),
            (1, 2, 5),
            (1, 3, 7),
        ]


def test_runners_waiting_for_a_locked_database_hold_no_thread_the_other_requests_need(server_factory, assets):
    import hashlib
    import secrets
    import sqlite3

    import httpx

    # Launches held: the test plays 60 runners of one queued job (more than the 40 worker threads).
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_DB_BUSY_TIMEOUT_S="600")
    job = server.submit({"name": "j", "config": demo_config(assets), "gpus": 0})
    token = secrets.token_urlsafe(16)
    db = sqlite3.connect(server.workspace / "tunedeck.db", isolation_level=None, timeout=60)
    db.execute(
        "UPDATE jobs SET runner_token_hash = ? WHERE id = ?",
        (hashlib.sha256(token.encode()).hexdigest(), job["id"]),
    )
    db.execute("BEGIN IMMEDIATE")  # another program holds the write lock: no batch can be stored
    answers: list[int] = []

    def post(i: int) -> None:
        r = httpx.post(
            f"{server.url}/api/jobs/{job['id']}/telemetry",
            json={"seq": i, "logs": [{"line": i, "t": 1.0, "stream": "stdout", "text": f"line {i}"}]},
            headers={"Authorization": f"Bearer {token}"},
            timeout=600,
        )
        answers.append(r.status_code)

    posts = [threading.Thread(target=post, args=(i,)) for i in range(60)]
    try:
        for t in posts:
            t.start()

        def waiting() -> bool:
            text = server.api.get("/metrics").text
            return "tunedeck_ingest_queue_batches 60.0" in text

        until(waiting, "all 60 batches handed to the writer while the database is locked")
        # A route that needs a worker thread still gets one.
        assert server.api.get(f"/api/jobs/{job['id']}", timeout=120).json()["name"] == "j"
        assert answers == []
    finally:
        db.execute("ROLLBACK")
        db.close()
        for t in posts:
            t.join(timeout=120)
    assert answers == [200] * 60
    assert sorted(lines(server, job["id"])) == sorted(f"line {i}" for i in range(60))


def test_a_batch_that_cannot_reach_the_store_fails_alone_and_frees_its_place(tmp_path):
    from sqlalchemy import text

    from tests.utils.factories import running_job_database
    from tunedeck.services.ingest.store_process import ProcessStore
    from tunedeck.services.ingest.writer import IngestWriter
    from tunedeck.services.jobs.jobstate import JobState

    engine = running_job_database(tmp_path / "t.db")
    writer = IngestWriter(engine, store=ProcessStore(tmp_path / "t.db", JobState(engine)))
    writer.start()
    try:
        # Nothing a request decodes is like this, but a fault on the way must not hold the writer:
        # more such groups than the store takes at once, then a good batch.
        for seq in range(3):
            bad = writer.submit(1, {"seq": seq, "logs": [], "hook": lambda: None})
            until(bad.done, "the unpicklable batch answered")
            assert bad.exception() is not None
        good = {"seq": 3, "logs": [{"line": 0, "t": 1.0, "stream": "stdout", "text": "stored"}]}
        writer.submit(1, good).result(timeout=120)
    finally:
        writer.stop()
    with engine.connect() as c:
        assert c.execute(text("SELECT text FROM log_lines")).scalars().all() == ["stored"]


def test_a_restarted_server_has_its_store_ready_before_the_running_jobs_next_batch(server_factory, assets):
    """Runners of running jobs post on through a restart: the store process starts with the server
    (its first pass finds them running), not with their first batch, which then waits for no start."""
    import os

    from tunedeck import procs
    from tunedeck.services.jobs.jobstate import JobState, move
    from tunedeck.store.db import make_engine
    from tunedeck.store.tables import JobStatus

    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true")
    job = server.submit({"name": "on", "config": demo_config(assets), "gpus": 0})["id"]
    engine = make_engine(server.workspace / "tunedeck.db")
    with JobState(engine).begin() as conn:  # this test plays its runner, alive through the restart
        me = os.getpid()
        move(conn, job, JobStatus.running, runner_pid=me, runner_started=procs.create_time(me))
    engine.dispose()
    server.stop()
    server.start()
    until(lambda: store_of(server), "the store process of a restarted server with a running job")
