"""The chart tiles answer exactly what a brute-force min/max over the raw rows gives, for random windows,
after incremental ingest in random batch sizes (resent and late batches too, and open tiles settled
midway, as a database from before `chart_open` has them) and after retention."""

from __future__ import annotations

import math
import random
from bisect import bisect_left, bisect_right

import pytest
from sqlalchemy import text

from tests.alerts.test_store import database
from tunedeck.services.charts import pyramid
from tunedeck.services.charts.memory import RAW
from tunedeck.services.charts.metrics import series_of
from tunedeck.services.charts.pyramid import Reader, Series
from tunedeck.services.ingest.retention import keep_level, rollup
from tunedeck.services.ingest.writer import IngestWriter
from tunedeck.store.db import make_engine, upgrade

GiB = 1 << 30
T0 = 1_800_000_000.0


def memory_trace(rnd: random.Random, n: int) -> list[tuple[float, int]]:
    """(t, used) of one GPU: irregular intervals, a pause, a drift, short spikes and dips."""
    t, used, out = T0, 20 * GiB, []
    for i in range(n):
        t += rnd.choice((0.1, 0.5, 1.0, 1.0, 2.0)) + (900.0 if i == n // 2 else 0.0)
        used = max(GiB, used + rnd.randint(-3, 3) * 2**24)
        spike = rnd.random() < 0.01
        out.append((round(t, 3), used + (rnd.choice((30, -15)) * GiB // 2 if spike else 0)))
    return out


def metric_lines(rnd: random.Random, n: int) -> list[dict]:
    step, out = 0, []
    for i in range(n):
        step += rnd.choice((1, 1, 1, 5, 10))
        loss = 3 * math.exp(-i / n) + rnd.random() * 0.1 + (20.0 if rnd.random() < 0.005 else 0.0)
        out.append({"current_steps": step, "total_steps": 10**6, "loss": round(loss, 6), "lr": 1e-4})
        if i % 37 == 0:  # an eval line: the same step, eval_loss and no loss
            out.append({"current_steps": step, "total_steps": 10**6, "eval_loss": round(loss + 0.2, 6)})
    return out


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One job stored through the ingest writer in random batch sizes, with resent batches."""
    import json

    rnd = random.Random(11)
    engine = make_engine(tmp_path_factory.mktemp("pyramid") / "p.db")
    upgrade(engine)
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at,"
                " finished_at) VALUES (1, 'p', 'succeeded', 2, '{}', '', '', '', :e, :e)"
            ),
            {"e": "2026-01-01 00:00:00"},
        )
    gpus = {g: memory_trace(rnd, 12_000) for g in (0, 1)}
    samples = [(t, g, u) for g, tr in gpus.items() for t, u in tr]
    samples.sort()
    lines = metric_lines(rnd, 6_000)
    batches, i, j = [], 0, 0
    while i < len(samples) or j < len(lines):
        k, m = rnd.choice((1, 3, 40, 700)), rnd.choice((0, 1, 5, 300))
        mem = [(i + q, *samples[i + q]) for q in range(min(k, len(samples) - i))]
        batch = {
            "seq": len(batches),
            "metrics": [
                {"line": j + q, "t": T0 + j + q, "raw": json.dumps(lines[j + q])}
                for q in range(min(m, len(lines) - j))
            ],
            "memory": {
                "line": [s[0] for s in mem],
                "t": [s[1] for s in mem],
                "gpu": [s[2] for s in mem],
                "used_bytes": [s[3] for s in mem],
            },
        }
        batches.append(batch)
        i, j = i + len(mem), j + len(batch["metrics"])
        if rnd.random() < 0.1:  # a runner resending a batch the server already stored
            batches.append(rnd.choice(batches))
    for i in range(len(batches) - 4):  # a few late: their points land in tiles that already closed
        if rnd.random() < 0.03:
            batches.insert(i + 4, batches.pop(i))
    writer = IngestWriter(engine)
    writer.start()
    try:
        for i, b in enumerate(batches):
            writer.submit(1, b).result(timeout=120)
            if i == len(batches) // 2:  # every level whole and no tile open: a database from before 0026
                with engine.begin() as c:
                    assert c.exec_driver_sql("SELECT count(*) FROM chart_open").scalar_one() > 0
                    pyramid.settle(c.connection.cursor(), [1])
    finally:
        writer.stop()
    metrics = [(p["current_steps"], p, T0 + line) for line, p in enumerate(lines)]
    return engine, gpus, metrics


def brute_stats(pts: list[tuple[float, float, float]]) -> tuple:
    """n, min and max (by y then x), first and last (by x then y): as the tiles keep them."""
    lo = min(pts, key=lambda p: (p[1], p[0]))
    hi = max(pts, key=lambda p: (p[1], p[0]))
    first = min(pts, key=lambda p: (p[0], p[1]))
    last = max(pts, key=lambda p: (p[0], p[1]))
    return (len(pts), lo[:2], hi[:2], first[:2], last[:2])


def answer_stats(row) -> tuple:
    pick = lambda i: (row[i], row[i + 1])  # noqa: E731
    return (
        int(row[pyramid.N]),
        pick(pyramid.XMIN),
        pick(pyramid.XMAX),
        pick(pyramid.XFIRST),
        pick(pyramid.XLAST),
    )


def check(ans: pyramid.Answer, pts: list, x0, x1, max_points: int, *, floor: int = 0) -> None:
    """`pts`: every raw point (x, y, a) of the series, sorted. Buckets hold the window's points; where
    levels below `floor` are gone, the whole floor-level tiles that meet the window."""
    lo = -math.inf if x0 is None else x0
    hi = math.inf if x1 is None else x1
    inside = pts[bisect_left(pts, (lo,)) : bisect_right(pts, (hi, math.inf))]
    drawn = list(zip(ans.x.tolist(), ans.y.tolist(), strict=True))
    if ans.level == 0:
        assert not floor and drawn == [p[:2] for p in inside] and ans.n == len(inside) <= max_points
        return
    budget = max(1, (max_points - 2) // 2)
    w = 4.0**ans.level
    assert len(ans.buckets) <= budget and len(drawn) <= 2 * budget + 2 <= max_points + 1
    if floor:  # the floor tiles (by their points' extent) that meet the window
        f = [math.floor(p[0] / 4**floor) for p in pts]
        met = {k for k, p in zip(f, pts, strict=True) if lo <= p[0] <= hi}
    total = 0
    for g, row in enumerate(ans.buckets):
        tiles = ans.tile[ans.group == g]
        a, b = tiles.min() * w, (tiles.max() + 1) * w
        i, j = bisect_left(pts, (a,)), bisect_left(pts, (b,))
        if floor:
            mine = [p for p, k in zip(pts[i:j], f[i:j], strict=True) if k in met]
        else:
            mine = [p for p in pts[i:j] if lo <= p[0] <= hi]
        assert answer_stats(row) == brute_stats(mine), (ans.level, g)
        # The max and min are real points of the series (the aux value too: the row id, the time).
        assert {tuple(row[i : i + 3]) for i in (pyramid.XMIN, pyramid.XMAX)} <= set(mine)
        total += len(mine)
    assert total == ans.n
    if not floor:
        assert ans.n == len(inside)
        # Every extreme of the window is drawn, and the level was needed: one finer has too many tiles.
        assert max(p[1] for p in inside) == max(ans.y) and min(p[1] for p in inside) == min(ans.y)
        if ans.level > pyramid.FINEST:  # (finer than the finest tiles, a window too long to read raw)
            assert len({math.floor(p[0] / 4 ** (ans.level - 1)) for p in inside}) > 4 * budget
    assert drawn == sorted(drawn)


def windows(rnd: random.Random, xs: list[float], k: int):
    yield None, None
    for _ in range(k):
        a, b = sorted(rnd.sample(xs, 2))
        if rnd.random() < 0.3:  # between points, or past the ends
            a, b = a - rnd.random() * 50, b + rnd.random() * 50
        yield a, b


def raw_points(engine, sql: str, *params) -> list[tuple[float, float, float]]:
    with engine.connect() as c:
        return sorted(tuple(map(float, r)) for r in c.exec_driver_sql(sql, params).all())


def memory_points(engine, gpu: int) -> list[tuple[float, float, float]]:
    return raw_points(
        engine, "SELECT t, used_bytes, id FROM memory_samples WHERE job_id = 1 AND gpu = ?", gpu
    )


def run_windows(engine, series: Series, pts: list, rnd: random.Random, k: int, *, floor: int = 0) -> set[int]:
    raw = engine.raw_connection()
    try:
        r, levels = Reader(raw.cursor(), 1), set()
        for x0, x1 in windows(rnd, sorted({p[0] for p in pts}), k):
            mp = rnd.choice((10, 64, 300, 2000, 30_000))
            ans = r.window(series, x0, x1, mp)
            levels.add(ans.level)
            check(ans, pts, x0, x1, mp, floor=floor)
        return levels
    finally:
        raw.close()


def test_memory_tiles_equal_brute_force(store):
    engine, gpus, _ = store
    rnd, levels = random.Random(5), set()
    for g, trace in gpus.items():
        pts = memory_points(engine, g)
        assert sorted((t, int(u)) for t, u, _ in pts) == trace  # each sample stored once, resends or not
        levels |= run_windows(engine, Series(pyramid.memory_key("", g), RAW, (1, "", g)), pts, rnd, 25)
    assert {0, 1} < levels and max(levels) >= 4  # raw, fine and coarse answers were all checked


def test_metric_tiles_equal_brute_force(store):
    engine, _, lines = store
    rnd, levels = random.Random(6), set()
    rows = raw_points(engine, "SELECT step, id, t FROM metric_points WHERE job_id = 1")
    assert len(rows) == len(lines)
    levels |= run_windows(engine, series_of(1, None), rows, rnd, 10)
    for name in ("loss", "eval_loss", "lr"):
        pts = raw_points(
            engine, f"SELECT step, {name}, t FROM metric_points WHERE job_id = 1 AND {name} IS NOT NULL"
        )
        assert len(pts) == sum(name in p for _, p, _ in lines)
        levels |= run_windows(engine, series_of(1, name, scan=len(rows)), pts, rnd, 15)
    assert {0, 1} < levels and max(levels) >= 3


def test_after_retention_old_runs_draw_from_whole_coarse_tiles(store, tmp_path):
    engine, gpus, _ = store
    before = {g: memory_points(engine, g) for g in gpus}
    copy = make_engine(tmp_path / "copy.db")  # the module's database stays whole for the other tests
    with engine.connect() as c:
        c.exec_driver_sql(f"VACUUM INTO '{tmp_path / 'copy.db'}'")
    assert rollup(copy, older_than_s=86400, interval_s=60)["jobs"] == 1
    level = keep_level(60)
    with copy.connect() as c:
        assert c.execute(text("SELECT count(*) FROM memory_samples")).scalar() <= 4
        assert (
            c.execute(text("SELECT min(level) FROM chart_tiles WHERE series LIKE 'memory.%'")).scalar()
            == level
        )
    rnd = random.Random(7)
    for g, pts in before.items():
        s = Series(pyramid.memory_key("", g), RAW, (1, "", g), floor=level)
        assert min(run_windows(copy, s, pts, rnd, 20, floor=level)) >= level


def test_a_tile_open_when_the_levels_were_settled_goes_up_once(tmp_path):
    """Small 1 Hz batches (4 s each, inside the 16 s tile an earlier one opened) with the open tiles
    settled midway, mid-tile: that tile then holds points every level has, and must not go up twice."""
    engine, job = database(tmp_path)
    assert job == 1  # (the module's readers follow job 1)
    rnd = random.Random(3)
    writer = IngestWriter(engine)
    writer.start()
    try:
        for b in range(200):
            line = list(range(4 * b, 4 * b + 4))
            used = [20 * GiB + rnd.randint(-50, 50) * 2**20 for _ in line]
            mem = {"line": line, "t": [T0 + i for i in line], "gpu": [0] * 4, "used_bytes": used}
            writer.submit(1, {"seq": b, "metrics": [], "memory": mem}).result(timeout=120)
            if b == 70:  # 284 s in: three quarters through a 16 s tile
                with engine.begin() as c:
                    pyramid.settle(c.connection.cursor(), [1])
    finally:
        writer.stop()
    with engine.connect() as c:  # the newest tile waits open (the coarse levels are not written a batch)
        assert c.exec_driver_sql("SELECT series, tile FROM chart_open").all() == [
            ("memory.0", (T0 + 799) // 16)
        ]
    pts = memory_points(engine, 0)
    assert len(pts) == 800
    levels = run_windows(
        engine, Series(pyramid.memory_key("", 0), RAW, (1, "", 0)), pts, random.Random(4), 40
    )
    assert max(levels) > pyramid.FINEST  # coarse tiles were read
