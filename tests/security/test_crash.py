"""kill -9 of the server, runners and trainers while jobs run: every job ends in a true state,
the stored points equal trainer_log.jsonl exactly, no process is left, the database is intact."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
from pathlib import Path

import pytest

from tests.integration.test_slice import assert_metrics_match
from tests.utils.servers import demo_config, job_processes, runner_token, wait_buffered
from tests.utils.wait import until

pytestmark = pytest.mark.slow
ROUNDS = 2


def first_point(server, job_id: int, timeout: float = 180) -> None:
    until(
        lambda: server.api.get(f"/api/jobs/{job_id}/metrics").json()["points"],
        f"job {job_id}'s metric point",
        timeout,
    )


def runner_pid(job: dict, missing_ok: bool = False) -> int | None:
    for p in job_processes(job["run_dir"], settle=0):  # the live ones, now
        if "tunedeck.runner" in " ".join(p.cmdline()):
            return p.pid
    if missing_ok:
        return None
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

        c = server.submit(
            {"name": f"server-killed-{r}", "config": demo_config(assets, max_steps=60), "gpus": 0}
        )
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


def test_a_reported_trainer_pid_that_is_not_the_jobs_is_never_signalled(server_factory, assets):
    """The trainer pid comes from telemetry: when the server kills a job (its runner ignored a cancel),
    a reported pid whose process is not the job's (a bystander in a session of its own) survives."""
    server = server_factory(
        TUNEDECK_GPU_SLOTS="0", TUNEDECK_CANCEL_ABORT_GRACE_S="0", TUNEDECK_CANCEL_TERM_GRACE_S="0"
    )
    bystander = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        job = server.submit({"name": "stuck", "config": demo_config(assets, max_steps=10**6), "gpus": 0})
        run = Path(job["run_dir"])
        db = sqlite3.connect(f"file:{server.workspace / 'tunedeck.db'}?mode=ro", uri=True)
        until(
            lambda: (
                (run / "trainer.pid").exists()
                and db.execute("SELECT trainer_pid FROM jobs WHERE id = ?", (job["id"],)).fetchone()[0]
                is not None
            ),
            "the runner's report of its trainer",
            timeout=180,
        )
        # A runner that hangs (stopped, with its trainer), after reporting a pid that is not the job's.
        for pid in (runner_pid(job), int((run / "trainer.pid").read_text())):
            os.kill(pid, signal.SIGSTOP)
        token = runner_token(server, job["id"])

        def started(pid: int):
            batch = {"seq": 10**6, "states": [{"event": "started", "trainer_pid": pid}]}
            return server.api.post(
                f"/api/jobs/{job['id']}/telemetry",
                json=batch,
                headers={"Authorization": f"Bearer {token}", "X-Tunedeck": "1"},
            )

        r = started(-1)  # not a pid at all (a negative one made every scheduler pass fail)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "trainer_pid", r.text
        assert started(bystander.pid).status_code == 200
        cancel = server.api.post(f"/api/jobs/{job['id']}/cancel", headers={"X-Tunedeck": "1"})
        assert cancel.status_code == 200, cancel.text
        # The runner ignores the cancel: after the grace the server kills the job itself.
        assert server.wait(job["id"], ("cancelled", "failed"), timeout=240)["status"] == "cancelled"
        assert bystander.poll() is None, "the server signalled a process that is not the job's"
        assert job_processes(job["run_dir"]) == []
    finally:
        bystander.kill()
        bystander.wait()
