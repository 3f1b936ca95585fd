"""Retention rolls old memory samples up: far fewer rows, every interval's min and max kept, spikes too."""

from __future__ import annotations

import os
import random
import subprocess
import sys

from sqlalchemy import text
from sqlmodel import Session

from tunedeck.db import make_engine, upgrade
from tunedeck.services.memory_charts import memory_page
from tunedeck.services.retention import rollup

GiB = 1 << 30


def seed(engine, *, job_id: int, ended: str, n: int = 3600) -> list[int]:
    rnd = random.Random(job_id)
    values = [int(14 * GiB + rnd.randint(-50, 50) * 2**20) for _ in range(n)]
    values[n // 3] = 30 * GiB  # one sub-interval spike
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at,"
                " finished_at, last_batch_seq) VALUES (:id, 'j', 'succeeded', 1, '{}', '', '', '', :e, :e, 0)"
            ),
            {"id": job_id, "e": ended},
        )
        c.execute(
            text(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes) "
                "VALUES (:j, :i, :t, 0, :v, :tot)"
            ),
            [{"j": job_id, "i": i, "t": 1000.0 + i, "v": v, "tot": 64 * GiB} for i, v in enumerate(values)],
        )
    return values


def test_rollup_keeps_extremes_and_means(tmp_path):
    engine = make_engine(tmp_path / "r.db")
    upgrade(engine)
    old = seed(engine, job_id=1, ended="2026-01-01 00:00:00")
    seed(engine, job_id=2, ended="2099-01-01 00:00:00")  # ended recently (in the future here): untouched
    report = rollup(engine, older_than_s=30 * 86400, interval_s=60)
    intervals = len({int((1000 + i) // 60) for i in range(3600)})
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT t0, n, min_bytes, max_bytes, mean_bytes FROM memory_rollups WHERE job_id=1 "
                "ORDER BY t0"
            )
        ).all()
        kept = c.execute(text("SELECT used_bytes FROM memory_samples WHERE job_id=1")).scalars().all()
        assert c.execute(text("SELECT count(*) FROM memory_samples WHERE job_id=2")).scalar() == 3600
    assert sum(r.n for r in rows) == 3600 and len(rows) == intervals
    for r in rows:
        window = [v for i, v in enumerate(old) if r.t0 <= 1000.0 + i < r.t0 + 60]
        assert (r.min_bytes, r.max_bytes) == (min(window), max(window))
        assert abs(r.mean_bytes - sum(window) / len(window)) < 1
    assert max(kept) == 30 * GiB and min(kept) == min(old)
    # The report counts what the table holds: each interval keeps its lowest and highest sample.
    assert report == {"jobs": 1, "before": 3600, "after": len(kept)}
    assert intervals <= len(kept) <= 2 * intervals
    assert rollup(engine, older_than_s=30 * 86400, interval_s=60)["jobs"] == 0  # idempotent
    with Session(engine) as s:  # the chart endpoint still shows the spike after rollup
        samples, _, _ = memory_page(
            s, job_id=1, gpu=None, after=None, max_points=50, t0=None, t1=None, limit=1000
        )
    assert max(x.used_bytes for x in samples) == 30 * GiB


def test_cli_rollup(tmp_path):
    ws = tmp_path / "ws"
    engine = make_engine(ws / "tunedeck.db")
    upgrade(engine)
    seed(engine, job_id=7, ended="2026-01-01 00:00:00", n=600)
    r = subprocess.run(
        [sys.executable, "-m", "tunedeck.cli", "db", "rollup", "--older-than-days", "1"],
        env={**os.environ, "TUNEDECK_WORKSPACE": str(ws)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert "rolled up 1 job(s): 600 samples" in r.stdout
    backup = tmp_path / "copy.db"
    r = subprocess.run(
        [sys.executable, "-m", "tunedeck.cli", "db", "backup", str(backup)],
        env={**os.environ, "TUNEDECK_WORKSPACE": str(ws)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert r.returncode == 0 and "integrity ok" in r.stdout
    copy = make_engine(backup)
    with copy.connect() as c:
        assert c.execute(text("SELECT count(*) FROM memory_rollups")).scalar() == len(
            {int((1000 + i) // 60) for i in range(600)}
        )
