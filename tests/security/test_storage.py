"""A read-only workspace and a full disk give clear errors, and the server survives them: telemetry
is refused with 507 and Retry-After (nothing acknowledged is lost), and /api/health says "degraded"
while the disk is full and "ok" once space returns."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.utils.app import App
from tests.utils.factories import create_job, post_telemetry
from tests.utils.servers import demo_config

RUNNER = "runner-secret"


@pytest.fixture
def small_fs(tmp_path):
    """A 4 MiB tmpfs of our own (root on this machine can mount); skipped where mounting is denied."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def fill(fs):
    """Fill the disk to the last byte; returns the file that does it."""
    filler = fs / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def test_read_only_workspace_is_refused_at_start(small_fs):
    (small_fs / "ws").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(small_fs / "ws"), "TUNEDECK_PORT": "0"}
    r = subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", "serve"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode != 0
    assert f"workspace {small_fs / 'ws'} is not writable" in r.stdout + r.stderr


def test_full_disk_is_a_clear_error_and_nothing_breaks(small_fs, assets):
    server = App(small_fs / "ws", assets, TUNEDECK_LAUNCH_PAUSED="true")
    server.start()
    try:
        filler = fill(small_fs)
        r = server.api.post(
            "/api/jobs", json={"name": "big", "config": demo_config(assets, lora_target="a" * 200_000)}
        )
        assert r.status_code == 507, r.text
        assert "full" in r.json()["detail"] or "No space" in r.json()["detail"]
        filler.unlink()
        assert server.api.get("/api/health").status_code == 200
        r = server.api.post("/api/jobs", json={"name": "after", "config": demo_config(assets)})
        assert r.status_code == 201, r.text
    finally:
        server.stop()


def test_a_full_disk_refuses_telemetry_with_507_until_space_returns_and_loses_nothing(small_fs, assets):
    server = App(small_fs / "ws", assets)
    server.start()
    try:
        job = create_job(
            server.engine, server.settings, config=demo_config(assets), name="t", runner_token=RUNNER
        )
        first = [{"current_steps": 1, "loss": 2.5}, {"current_steps": 2, "loss": 2.25}]
        assert (
            post_telemetry(server.api, job.id, RUNNER, seq=0, points=first, logs=["a", "b"]).status_code
            == 200
        )
        assert server.api.get("/api/health").json()["status"] == "ok"

        filler = fill(small_fs)
        # Output lines of about 1 MB: more than a full disk has room for.
        lines = [f"{i} " + "x" * 2000 for i in range(500)]
        late = [{"current_steps": 3, "loss": 2.0}]
        r = post_telemetry(server.api, job.id, RUNNER, seq=1, start_line=2, points=late, logs=lines)
        assert r.status_code == 507, r.text
        assert "the disk holding the database is full" in r.json()["detail"]
        assert r.headers["Retry-After"] == "30"
        health = server.api.get("/api/health").json()
        assert health["status"] == "degraded" and "is full" in health["reason"], health
        assert server.api.get("/api/health").json()["status"] == "degraded"  # as long as the disk is full

        filler.unlink()
        assert server.api.get("/api/health").json() | {"reason": None} == health | {
            "status": "ok",
            "reason": None,
        }
        # The runner sends the batch again (it is in its outbox): it goes in, and so did the one before.
        r = post_telemetry(server.api, job.id, RUNNER, seq=1, start_line=2, points=late, logs=lines)
        assert r.status_code == 200, r.text
        assert [p["loss"] for p in server.all(job.id, "metrics")] == [2.5, 2.25, 2.0]
        assert [x["text"] for x in server.all(job.id, "logs")] == ["a", "b", *lines]
    finally:
        server.stop()
