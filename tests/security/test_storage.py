"""A read-only workspace and a full disk give clear errors, and the server survives them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.utils.app import App
from tests.utils.servers import demo_config


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
        filler = small_fs / "filler"
        with open(filler, "wb") as f:  # fill the disk to the last byte
            try:
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            except OSError:
                pass
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
