"""A runner whose trainer has ended and whose server is gone does not wait out the hour: it leaves
when the server said it stopped, when asked to (SIGTERM), or when no server answered for
`TUNEDECK_RUNNER_UNREACHABLE_S`. Its outbox stays on disk, and the next server replays all of it.

Real servers and real runners; the trainer is the stand-in that holds until released
(tests/utils/standin.py)."""

from __future__ import annotations

import os
import signal
import sqlite3
from contextlib import closing
from pathlib import Path

from tests.utils.servers import demo_config
from tests.utils.standin import release, training_env
from tests.utils.wait import until
from tunedeck import procs

NEVER = "3600"  # seconds: a wait this long never ends within a test


def runner_of(server, job_id: int) -> tuple[int, float]:
    with closing(sqlite3.connect(server.workspace / "tunedeck.db", timeout=60)) as db:
        return db.execute("SELECT runner_pid, runner_started FROM jobs WHERE id = ?", (job_id,)).fetchone()


def started(server, name: str) -> tuple[dict, tuple[int, float]]:
    """A held job whose runner has delivered its trainer's first line."""
    job = server.submit({"name": name, "gpus": 0, "config": demo_config(server.assets)})
    server.wait(job["id"], ("running",))
    until(lambda: "first line" in texts(server, job["id"]), f"{name}'s first line")
    return job, runner_of(server, job["id"])


def texts(server, job_id: int) -> list[str]:
    return [x["text"] for x in server.all(job_id, "logs")]


def ended_in_outbox(run_dir: str) -> bool:
    outbox = Path(run_dir) / "outbox.jsonl"
    return outbox.exists() and b'"event": "exited"' in outbox.read_bytes()


def gone(runner: tuple[int, float], what: str) -> None:
    until(lambda: not procs.alive(*runner), what)


def recovered(server, job: dict) -> None:
    """The next server replays the outbox the runner left: the job ends as its trainer did, every line kept."""
    done = server.wait(job["id"], ("succeeded", "failed", "cancelled"))
    assert done["status"] == "succeeded", done
    lines = [t for t in texts(server, job["id"]) if t in ("first line", "last line")]
    assert lines == ["first line", "last line"]
    assert not (Path(job["run_dir"]) / "server.stopped").exists()


def test_a_finished_runner_leaves_its_outbox_when_the_server_is_gone(server_factory, assets, tmp_path):
    env = {
        "TUNEDECK_TRAIN_PYTHON": str(training_env(tmp_path / "train-env")),
        "TUNEDECK_GPU_SLOTS": "0",
        "TUNEDECK_MEMORY_SAMPLE_S": NEVER,
        # Only what each part tests may end a runner early: never the hour, never the unreachable wait.
        "TUNEDECK_RUNNER_GIVE_UP_S": NEVER,
        "TUNEDECK_RUNNER_UNREACHABLE_S": NEVER,
    }

    def serve(**more: str):
        server = server_factory(**{**env, **more})
        server.assets = assets
        return server

    # A server stopped with SIGTERM tells its runners: this one leaves once its trainer has ended.
    server = serve()
    told, runner = started(server, "held-stopped")
    server.stop()
    assert (Path(told["run_dir"]) / "server.stopped").is_file()
    release(Path(told["run_dir"]))
    gone(runner, "the runner leaving after the stopped server told it")
    assert ended_in_outbox(told["run_dir"])
    assert "the server was stopped" in (Path(told["run_dir"]) / "runner.log").read_text()

    # A killed server tells nothing: the runner waits, until SIGTERM ends it at once.
    server = serve()
    recovered(server, told)
    killed, runner = started(server, "held-killed")
    server.kill()
    release(Path(killed["run_dir"]))
    until(lambda: ended_in_outbox(killed["run_dir"]), "the trainer's end in the outbox")
    assert procs.alive(*runner)  # waiting for a server (it would for an hour)
    os.kill(runner[0], signal.SIGTERM)
    gone(runner, "the runner ending on SIGTERM")
    assert "asked to stop" in (Path(killed["run_dir"]) / "runner.log").read_text()

    # Nobody answering for TUNEDECK_RUNNER_UNREACHABLE_S ends it too.
    server = serve(TUNEDECK_RUNNER_UNREACHABLE_S="1")
    recovered(server, killed)
    lost, runner = started(server, "held-unreachable")
    server.kill()
    release(Path(lost["run_dir"]))
    gone(runner, "the runner leaving after nobody answered")
    assert "no server answered for" in (Path(lost["run_dir"]) / "runner.log").read_text()
    recovered(serve(), lost)
