"""What a job leaves behind is private: its runner token dies with it, and the database and run files
are readable by the server's user only."""

from __future__ import annotations

import hashlib
import os
import secrets
import sqlite3
import stat
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import httpx

from tests.utils.servers import demo_config


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_finished_jobs_runner_token_is_dead_and_its_files_are_private(server_factory, assets, tmp_path):
    server = server_factory()
    job = server.submit(
        {"name": "short", "config": demo_config(assets, max_steps=2, eval_steps=2, save_steps=2)}
    )
    job = server.wait(job["id"], ("succeeded", "failed"))
    assert job["status"] == "succeeded", job["error"]
    run_dir = Path(job["run_dir"])
    db_file = server.workspace / "tunedeck.db"
    with closing(sqlite3.connect(db_file)) as db:
        (stored,) = db.execute("SELECT runner_token_hash FROM jobs WHERE id = ?", (job["id"],)).fetchone()
    assert stored is None  # the token died with the job
    # The route refuses an ended job even with a token that matches what an older row still holds.
    runner_token = secrets.token_urlsafe(32)
    with closing(sqlite3.connect(db_file)) as db, db:
        db.execute(
            "UPDATE jobs SET runner_token_hash = ? WHERE id = ?",
            (hashlib.sha256(runner_token.encode()).hexdigest(), job["id"]),
        )
    logs_before = len(server.all(job["id"], "logs"))

    batch = {
        "seq": 10_000,
        "logs": [{"line": 10_000, "t": 1.0, "stream": "stdout", "text": "forged"}],
        "states": [{"event": "started", "trainer_pid": 1}],
    }
    r = httpx.post(
        f"{server.url}/api/jobs/{job['id']}/telemetry",
        json=batch,
        headers={"Authorization": f"Bearer {runner_token}", "X-Tunedeck": "1"},
    )
    assert r.status_code == 401, r.text
    after = server.api.get(f"/api/jobs/{job['id']}").json()
    assert len(server.all(job["id"], "logs")) == logs_before
    assert "forged" not in {line["text"] for line in server.all(job["id"], "logs")}
    assert after["status"] == "succeeded"

    ws = server.workspace
    db = ws / "tunedeck.db"
    for f in (db, Path(f"{db}-wal"), Path(f"{db}-shm")):
        assert mode(f) == 0o600, f"{f.name}: {oct(mode(f))}"
    for d in (ws / "runs", run_dir, run_dir / "output"):
        assert mode(d) == 0o700, f"{d}: {oct(mode(d))}"
    names = {p.name for p in run_dir.iterdir()}
    assert {"train.yaml", "runner.json", "runner.log", "outbox.jsonl", "train.log", "result.json"} <= names
    for p in run_dir.rglob("*"):
        want = 0o700 if p.is_dir() else 0o600
        assert mode(p) & 0o077 == 0, f"{p.relative_to(run_dir)}: {oct(mode(p))}, want {oct(want)}"


def test_a_database_made_by_the_cli_is_private(tmp_path):
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(tmp_path / "ws")}
    r = subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", "token", "create", "--name", "a"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert mode(tmp_path / "ws" / "tunedeck.db") == 0o600
    assert mode(tmp_path / "ws") == 0o700
