"""Utilisation and temperatures survive downsampling: the chart tiles keep them beside the bytes
(`util.<gpu>`, `temp.<gpu>`, `junction.<gpu>`), tiled from what ingest stored, and a chart read from
tiles alone (a downsampled window, or a run whose raw samples retention dropped) still carries them."""

from __future__ import annotations

import json
import math
import random
from collections import defaultdict

import pytest
from sqlalchemy import text
from sqlmodel import Session

from tests.test_ingest_columns import HEADERS, columns, new_job, samples
from tunedeck.services.charts import pyramid
from tunedeck.services.charts.memory import memory_page
from tunedeck.services.ingest.retention import rollup
from tunedeck.store.db import make_engine, upgrade

GiB = 1 << 30


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    from tests.utils.app import App

    a = App(tmp_path_factory.mktemp("readings") / "ws", assets).start()
    yield a
    a.stop()


def reading_tiles(engine, job_id: int) -> dict[tuple, tuple]:
    with engine.begin() as c:  # every level whole: each series' open finest tile folded up first
        pyramid.settle(c.connection.cursor(), [job_id])
    with engine.connect() as c:
        rows = c.execute(
            text(
                f"SELECT series, level, tile, {', '.join(pyramid.FIELDS)} FROM chart_tiles WHERE job_id = :j "
                "AND series NOT LIKE 'memory.%' AND series NOT LIKE 'metric.%'"
            ),
            {"j": job_id},
        ).all()
    return {(s, lv, t): tuple(rest) for s, lv, t, *rest in rows}


def brute(engine, job_id: int) -> dict[tuple, tuple]:
    """Every reading's tiles from the stored rows, by the pyramid's rules (min / max by (y, x), first /
    last by (x, y), each as (x, y, row id)); a sample without the reading is in none of its tiles."""
    cols = ", ".join(pyramid.READINGS.values())
    with engine.connect() as c:
        rows = c.execute(
            text(f"SELECT node, gpu, t, id, {cols} FROM memory_samples WHERE job_id = :j"), {"j": job_id}
        ).all()
    out = {}
    for level in range(pyramid.FINEST, pyramid.LEVELS + 1):
        groups = defaultdict(list)
        for node, gpu, t, rid, *values in rows:
            for prefix, v in zip(pyramid.READINGS, values):
                if v is not None:
                    key = (pyramid.memory_key(node, gpu, prefix), level, math.floor(t / 4**level))
                    groups[key].append((t, v, rid))
        for key, pts in groups.items():
            lo = min(pts, key=lambda p: (p[1], p[0]))
            hi = max(pts, key=lambda p: (p[1], p[0]))
            first = min(pts, key=lambda p: (p[0], p[1]))
            last = max(pts, key=lambda p: (p[0], p[1]))
            out[key] = (len(pts), *lo, *hi, *first, *last)
    return out


def test_ingest_tiles_every_reading_as_stored(app, assets):
    job_id = new_job(app, assets, "readings")
    rows = samples(0, 2400)
    for i, r in enumerate(rows):  # the edge sensor on some samples, the junction on others
        r["temp_c"] = None if i % 5 == 0 else 40.0 + i % 37
        r["temp_junction_c"] = 60.0 + i % 11 if i % 2 else None
    body = lambda seq, part: json.dumps(  # noqa: E731
        {"seq": seq, "memory": {**columns(part), "temp_junction_c": [r["temp_junction_c"] for r in part]}}
    )
    # A first batch tiled from the columns handed over, then overlapping resends read back from the rows.
    for seq, (a, b) in enumerate(((0, 1000), (800, 2400), (0, 2400))):
        r = app.api.post(f"/api/jobs/{job_id}/telemetry", content=body(seq, rows[a:b]), headers=HEADERS)
        assert r.status_code == 200, r.text
    got, want = reading_tiles(app.engine, job_id), brute(app.engine, job_id)
    assert {k[0].split(".")[0] for k in want} == {"util", "temp", "junction"}
    assert got == want


def seed(engine, *, n: int = 6000) -> tuple[list[float], list[float]]:
    rnd = random.Random(29)
    util = [60.0 + rnd.randint(0, 20) for _ in range(n)]
    temp = [50.0 + rnd.randint(0, 5) for _ in range(n)]
    util[1000] = 0.0  # a stall
    util[4100], temp[4300] = 100.0, 93.0  # a busy spike and a hot one, where the bytes do nothing
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at,"
                " finished_at, last_batch_seq) VALUES (1, 'old', 'succeeded', 1, '{}', '', '', '',"
                " '2025-01-01 00:00:00', '2025-01-02 00:00:00', 0)"
            )
        )
        c.execute(
            text(
                "INSERT INTO memory_samples (job_id, line, t, gpu, used_bytes, total_bytes, name, util, temp_c) "
                "VALUES (1, :i, :t, 0, :v, :tot, 'MI250X', :u, :c)"
            ),
            [
                {"i": i, "t": 1000.0 + i, "v": 20 * GiB + (i % 7) * 2**20, "tot": 64 * GiB, "u": u, "c": c}
                for i, (u, c) in enumerate(zip(util, temp))
            ],
        )
    return util, temp


def chart(engine, max_points: int = 60):
    with Session(engine) as s:
        got, _, reduced = memory_page(
            s, job_id=1, gpu=None, after=None, max_points=max_points, t0=None, t1=None, limit=1000
        )
    assert reduced
    return got


def test_a_downsampled_and_a_pruned_run_keep_utilisation_and_temperature(tmp_path):
    engine = make_engine(tmp_path / "r.db")
    upgrade(engine)
    util, temp = seed(engine)
    for when in ("downsampled", "pruned"):
        if when == "pruned":
            assert rollup(engine, older_than_s=86400, interval_s=60)["jobs"] == 1
            with engine.connect() as c:
                assert c.execute(text("SELECT count(*) FROM memory_samples")).scalar() <= 2
        got = chart(engine)
        assert 10 <= len(got) <= 60
        # Every drawn sample has both readings, from the tiles: each a value the device reported ...
        assert all(x.util in util and x.temp_c in temp for x in got), when
        # ... and the spikes stay drawn, near where they were (within a bucket of about 100 s).
        busy = max(got, key=lambda x: x.util)
        hot = max(got, key=lambda x: x.temp_c)
        assert busy.util == 100.0 and abs(busy.t - 5100) <= 200, (when, busy)
        assert hot.temp_c == 93.0 and abs(hot.t - 5300) <= 200, (when, hot)
        assert all(x.temp_junction_c is None for x in got)  # a reading never sent stays unsaid
    with engine.connect() as c:  # retention dropped the fine reading tiles with the bytes' ones
        levels = c.execute(
            text("SELECT series, min(level) FROM chart_tiles WHERE job_id = 1 GROUP BY series")
        ).all()
    assert {s for s, _ in levels} == {"memory.0", "util.0", "temp.0"}
    assert len({lv for _, lv in levels}) == 1 and levels[0][1] > pyramid.FINEST


def test_a_downsampled_chart_keeps_the_xgmi_counters_of_the_samples_it_draws(tmp_path):
    """Cumulative counters need no tile: a drawn sample is a stored one, and the growth between two
    drawn samples over their time apart is the exact average rate of that stretch (the job page's)."""
    engine = make_engine(tmp_path / "x.db")
    upgrade(engine)
    seed(engine)
    with engine.begin() as c:  # 1000 bytes read and 10 written a second, since t = 1000
        c.execute(
            text(
                "UPDATE memory_samples SET xgmi_read_bytes = 1000 * (t - 1000), xgmi_write_bytes = 10 * (t - 1000)"
            )
        )
    got = chart(engine)
    assert 10 <= len(got) <= 60
    assert all(
        x.xgmi_read_bytes == 1000 * (x.t - 1000) and x.xgmi_write_bytes == 10 * (x.t - 1000) for x in got
    )
