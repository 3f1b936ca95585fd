"""Retention drops old raw memory samples; the chart tiles stay, so old runs still draw, spikes too."""

from __future__ import annotations

import os
import random
import subprocess
import sys

from sqlalchemy import text
from sqlmodel import Session

from tunedeck.services.charts.memory import gpus_of, memory_page
from tunedeck.services.ingest.retention import keep_level, rollup
from tunedeck.store.db import make_engine, upgrade

GiB = 1 << 30


def seed(engine, *, job_id: int, ended: str, n: int = 3600, created: str | None = None) -> list[int]:
    rnd = random.Random(job_id)
    values = [int(14 * GiB + rnd.randint(-50, 50) * 2**20) for _ in range(n)]
    values[n // 3] = 30 * GiB  # one sub-interval spike
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at,"
                " finished_at, last_batch_seq) VALUES (:id, 'j', 'succeeded', 1, '{}', '', '', '', :c, :e, 0)"
            ),
            {"id": job_id, "e": ended, "c": created or ended},
        )
        c.execute(
            text(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes, name) "
                "VALUES (:j, :i, :t, 0, :v, :tot, 'H200')"
            ),
            [{"j": job_id, "i": i, "t": 1000.0 + i, "v": v, "tot": 64 * GiB} for i, v in enumerate(values)],
        )
    return values


def db_command(ws, *args: str) -> subprocess.CompletedProcess:
    """`tunedeck db ARGS...` as a subprocess on the workspace `ws`."""
    return subprocess.run(
        [sys.executable, "-m", "tunedeck.cli.main", "db", *args],
        env={**os.environ, "TUNEDECK_WORKSPACE": str(ws)},
        capture_output=True,
        text=True,
        check=False,
    )


def test_retention_keeps_coarse_tiles_and_the_peak(tmp_path):
    engine = make_engine(tmp_path / "r.db")
    upgrade(engine)
    old = seed(engine, job_id=1, ended="2026-01-01 00:00:00")
    seed(engine, job_id=2, ended="2099-01-01 00:00:00")  # ended recently (in the future here): untouched
    # Imported recently, a run that ended long ago: kept from the import, as long as a run of its own.
    seed(engine, job_id=3, ended="2026-01-01 00:00:00", created="2099-01-01 00:00:00")
    report = rollup(engine, older_than_s=30 * 86400, interval_s=60)
    level = keep_level(60)
    assert 4**level >= 60 > 4 ** (level - 1)
    with engine.connect() as c:
        kept = c.execute(text("SELECT used_bytes, t FROM memory_samples WHERE job_id=1")).all()
        tiles = c.execute(
            text(
                "SELECT level, tile, n, y_min, y_max, x_max FROM chart_tiles WHERE job_id=1 "
                "AND series='memory.0' ORDER BY level, tile"
            )
        ).all()
        for job in (2, 3):
            assert c.execute(text(f"SELECT count(*) FROM memory_samples WHERE job_id={job}")).scalar() == 3600
    # The peak and the newest sample stay (the measured peak, the device's name and size).
    assert sorted(kept) == sorted({(30 * GiB, 1000.0 + 1200), (old[-1], 1000.0 + 3599)})
    assert report == {"jobs": 1, "before": 3600, "after": len(kept)}
    assert min(r.level for r in tiles) == level
    for r in tiles:  # each kept tile still holds the exact min and max of its samples
        w = 4**r.level
        window = [v for i, v in enumerate(old) if int((1000 + i) // w) == r.tile]
        assert (r.n, r.y_min, r.y_max) == (len(window), min(window), max(window))
    assert rollup(engine, older_than_s=30 * 86400, interval_s=60)["jobs"] == 0  # idempotent
    with Session(engine) as s:  # the chart still shows the whole hour, and the spike at its time
        samples, _, reduced = memory_page(
            s, job_id=1, gpu=None, after=None, max_points=50, t0=None, t1=None, limit=1000
        )
        assert [(g.gpu, g.name, g.total_bytes) for g in gpus_of(s, 1)] == [(0, "H200", 64 * GiB)]
    assert reduced and 10 <= len(samples) <= 50
    top = max(samples, key=lambda x: x.used_bytes)
    assert (top.used_bytes, top.t) == (30 * GiB, 1000.0 + 1200)
    assert samples[0].t < 1000 + 4**level and samples[-1].t > 4600 - 4**level
    assert all(x.total_bytes == 64 * GiB for x in samples)


def test_cli_rollup(tmp_path):
    ws = tmp_path / "ws"
    engine = make_engine(ws / "tunedeck.db")
    upgrade(engine)
    seed(engine, job_id=7, ended="2026-01-01 00:00:00", n=600)
    r = db_command(ws, "rollup", "--older-than-days", "1")
    assert r.returncode == 0, r.stderr
    assert "rolled up 1 job(s): 600 samples → 2" in r.stdout
    backup = tmp_path / "copy.db"
    r = db_command(ws, "backup", str(backup))
    assert r.returncode == 0 and "integrity ok" in r.stdout
    copy = make_engine(backup)
    with copy.connect() as c:
        assert c.execute(text("SELECT level FROM chart_pruned WHERE job_id = 7")).scalar() == keep_level(60)
        assert c.execute(text("SELECT sum(n) FROM chart_tiles WHERE level = 5")).scalar() == 600
