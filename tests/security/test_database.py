"""The SQLite file under stress: a writer holding the lock, and damaged files at start and at run time."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.security.test_auth import cli
from tests.utils.servers import Server, demo_config, free_port
from tests.utils.wait import until

PAGE = 4096


def trainer_log(lines: int) -> bytes:
    return "".join(
        json.dumps(
            {
                "current_steps": i + 1,
                "total_steps": lines,
                "loss": 2.0 - i / lines,
                "learning_rate": 1e-4,
                "epoch": i / lines,
                "note": "x" * 80,
            }
        )
        + "\n"
        for i in range(lines)
    ).encode()


def refused(ws: Path, **more: str) -> str:
    """`tunedeck serve` on this workspace must exit by itself, non-zero; its output."""
    env = {**os.environ, "TUNEDECK_WORKSPACE": str(ws), "TUNEDECK_PORT": str(free_port()), **more}
    proc = subprocess.Popen(
        [sys.executable, "-m", "tunedeck.cli.main", "serve"],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        out, _ = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        raise AssertionError(f"the server started on a damaged database:\n{out}") from None
    assert proc.returncode != 0, out
    assert "Traceback" not in out and "tunedeck db backup" in out, out
    (line,) = [x for x in out.splitlines() if x.startswith("error:")]  # one clear line
    return line


def test_a_held_write_lock_is_a_503_to_retry(server_factory, assets):
    server = server_factory(TUNEDECK_LAUNCH_PAUSED="true", TUNEDECK_DB_BUSY_TIMEOUT_S="1")
    spec = {"name": "busy", "config": demo_config(assets), "gpus": 0}
    other = sqlite3.connect(server.workspace / "tunedeck.db", isolation_level=None, timeout=120)
    other.execute("BEGIN IMMEDIATE")  # a backup or a sqlite3 shell holding the write lock
    try:
        for r in (
            server.api.post("/api/jobs", json=spec),
            server.api.post("/api/runs/import", files={"trainer_log": trainer_log(3)}, data={"name": "busy"}),
        ):
            assert r.status_code == 503, r.text
            assert r.json()["detail"].startswith("database busy, retry")
            assert int(r.headers["retry-after"]) > 0
    finally:
        other.execute("ROLLBACK")
        other.close()
    assert server.api.post("/api/jobs", json=spec).status_code == 201


def test_an_empty_or_headless_file_is_refused_and_kept(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    db = ws / "tunedeck.db"
    db.touch()  # what a crash or a bad copy leaves: SQLite would take it for a new database
    line = refused(ws)
    assert "empty (0 bytes)" in line and str(db) in line
    r = cli(ws, "token", "create", "--name", "root", "--role", "admin")
    assert r.returncode != 0 and "empty (0 bytes)" in r.stderr
    assert db.stat().st_size == 0

    db.unlink()
    assert cli(ws, "token", "create", "--name", "root", "--role", "admin").returncode == 0
    with open(db, "r+b") as f:
        f.write(b"not a database!!")  # the 16-byte magic header
    line = refused(ws)
    assert "is damaged or not a database" in line and "file is not a database" in line
    assert db.read_bytes()[:16] == b"not a database!!"


def damage(db: Path) -> None:
    """Overwrite the b-tree page headers of the back half of the file (the imported run's rows)."""
    pages = db.stat().st_size // PAGE
    with open(db, "r+b") as f:
        for page in range(pages // 2, pages):
            f.seek(page * PAGE)
            f.write(b"\xee" * 12)


def stored_run(tmp_path: Path, assets: Path) -> tuple[Path, Path, Path, int]:
    """A workspace whose database holds an imported run of 4000 points, checkpointed, and its backup:
    (workspace, database, backup, the run's job id)."""
    ws = tmp_path / "ws"
    db = ws / "tunedeck.db"
    server = Server(ws, assets).start()
    try:
        r = server.api.post(
            "/api/runs/import", files={"trainer_log": trainer_log(4000)}, data={"name": "big"}
        )
        assert r.status_code == 201, r.text
        job = r.json()["id"]
    finally:
        server.stop()
    with sqlite3.connect(db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    backup = tmp_path / "backup.db"
    assert cli(ws, "db", "backup", str(backup)).returncode == 0
    return ws, db, backup, job


def test_damage_at_run_time_is_a_503_and_refused_at_start_until_restored(tmp_path, assets):
    ws, db, backup, job = stored_run(tmp_path, assets)

    server = Server(ws, assets).start()
    try:
        damage(db)
        r = server.api.get(f"/api/jobs/{job}/metrics", params={"limit": 5000})
        assert r.status_code == 503, r.text
        assert "damaged" in r.json()["detail"] and "tunedeck db backup" in r.json()["detail"]
        assert r.headers["Retry-After"]
        health = server.api.get("/api/health")  # it answers, and says why the server is not well
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert "damaged" in health.json()["reason"] and "tunedeck db restore" in health.json()["reason"]
    finally:
        server.stop()

    line = refused(ws)
    assert "is damaged" in line and "tunedeck db restore" in line
    r = cli(ws, "db", "restore", str(backup))
    assert r.returncode == 0, r.stderr
    assert "kept as" in r.stdout and list(ws.glob("tunedeck.db.replaced-*"))  # the damaged file is kept aside
    server = Server(ws, assets).start()
    try:
        assert len(server.all(job, "metrics")) == 4000
    finally:
        server.stop()


def test_the_full_check_runs_beside_the_serving_server_and_its_finding_is_refused_at_the_next_start(
    tmp_path, assets
):
    """Damage made while no server runs: the start reads the header and schema only and answers; the
    full check beside it finds the damage (health says so), and the next start refuses the file until
    it is restored. With TUNEDECK_INTEGRITY_CHECK=start the whole file is read before serving."""
    ws, db, backup, _ = stored_run(tmp_path, assets)
    damage(db)
    line = refused(ws, TUNEDECK_INTEGRITY_CHECK="start")
    assert "is damaged" in line and "quick_check" in line, line
    server = Server(ws, assets).start()  # the default: it answers first
    try:

        def found() -> dict | None:
            health = server.api.get("/api/health").json()
            return health if health["integrity"]["state"] == "damaged" else None

        health = until(found, "the full check's finding")
        assert health["status"] == "degraded" and "damaged" in health["reason"], health
        assert health["integrity"]["checked_at"] and health["integrity"]["took_s"] is not None
    finally:
        server.stop()
    assert (ws / "tunedeck.db.damaged").exists()
    line = refused(ws)
    assert "found while serving" in line and "tunedeck db restore" in line, line
    r = cli(ws, "db", "check")
    assert r.returncode == 1 and "damaged" in r.stderr, r.stderr
    assert cli(ws, "db", "restore", str(backup)).returncode == 0
    assert not (ws / "tunedeck.db.damaged").exists()  # the old file's finding went with it
    r = cli(ws, "db", "check")
    assert r.returncode == 0 and r.stdout.startswith("ok:"), r.stdout + r.stderr
    server = Server(ws, assets).start()
    try:
        health = until(
            lambda: (h := server.api.get("/api/health").json())["integrity"]["state"] == "ok" and h,
            "a sound file's check",
        )
        assert health["status"] == "ok" and health["integrity"]["checked_at"], health
    finally:
        server.stop()
