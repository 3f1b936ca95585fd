"""kill -9 of the server, runners and trainers while jobs run: every job ends in a true state,
the stored points equal trainer_log.jsonl exactly, no process is left, the database is intact."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from pathlib import Path

import pytest

from tests.conftest import demo_config, job_processes, wait_buffered
from tests.integration.test_slice import assert_metrics_match

pytestmark = pytest.mark.slow
ROUNDS = 2


def first_point(server, job_id: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not server.api.get(f"/api/jobs/{job_id}/metrics").json()["points"]:
        assert time.monotonic() < deadline, f"job {job_id}: no metric point"
        time.sleep(0.2)


def runner_pid(job: dict) -> int:
    for p in job_processes(job["run_dir"], settle=0):  # the live ones, now
        if "tunedeck.runner" in " ".join(p.cmdline()):
            return p.pid
    raise AssertionError("runner not found")


def test_kill_9_matrix(server_factory, assets):
    server = server_factory(TUNEDECK_CPU_SLOTS="2")
    expect: dict[int, str] = {}
    kills = {"server": 0, "runner": 0, "trainer": 0}
    long = demo_config(assets, max_steps=3000, save_steps=1000)
    for r in range(ROUNDS):
        a = server.submit({"name": f"trainer-killed-{r}", "config": long, "gpus": 0})
        b = server.submit({"name": f"runner-killed-{r}", "config": long, "gpus": 0})
        first_point(server, a["id"])
        first_point(server, b["id"])
        os.kill(int((Path(a["run_dir"]) / "trainer.pid").read_text()), signal.SIGKILL)
        kills["trainer"] += 1
        os.kill(runner_pid(server.api.get(f"/api/jobs/{b['id']}").json()), signal.SIGKILL)
        kills["runner"] += 1
        expect[a["id"]], expect[b["id"]] = "failed", "failed"
        server.wait(a["id"], ("failed", "succeeded", "cancelled"))
        server.wait(b["id"], ("failed", "succeeded", "cancelled"))

        c = server.submit({"name": f"server-killed-{r}", "config": demo_config(assets, max_steps=60), "gpus": 0})
        first_point(server, c["id"])
        server.kill()
        kills["server"] += 1
        wait_buffered(c["run_dir"])  # the runner trains on and buffers while the server is away
        server.start()
        expect[c["id"]] = "succeeded"
        server.wait(c["id"], ("failed", "succeeded", "cancelled"))

    for job_id, status in expect.items():
        job = server.api.get(f"/api/jobs/{job_id}").json()
        assert job["status"] == status, job
        if job["name"].startswith("trainer-killed"):
            assert job["error"] == "killed by SIGKILL"
        if job["name"].startswith("runner-killed"):
            assert job["error"].startswith("runner lost")
        assert_metrics_match(server, job)
        assert job_processes(job["run_dir"]) == [], job["name"]
    db = sqlite3.connect(server.workspace / "tunedeck.db")
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    print(f"kill -9 matrix: {kills}, {len(expect)} jobs, all states true, points exact, no orphans")
