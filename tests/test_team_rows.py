"""A job's row on the team page (its peak VRAM, the device size, its last loss) is read in a few
index seeks however long the run has been: every batch changes the row, so a read that walked the
run's samples would cost more with every hour. The work is counted in SQLite's own VM steps, not
timed. The row is read from what the database keeps, so a restarted server shows the same peak."""

from __future__ import annotations

import json
import math
import random
import sqlite3

import pytest
from sqlalchemy import event, text

from tests.utils.factories import create_job
from tests.utils.servers import demo_config
from tests.utils.wait import until
from tunedeck.services.live import feed
from tunedeck.store.db import make_engine

RUNNER = "runner-secret"
AUTH = {"Authorization": f"Bearer {RUNNER}"}
GiB = 1 << 30
T0 = 1_800_000_000.0


def loss(sample: int) -> float:
    return (4000 - sample) / 1000


def post(app, job_id: int, seq: int, *, first: int, n: int, node: str = "", spike_at: int | None = None):
    """n samples on each of GPUs 0 and 1 (lines first...), 10 GiB of 80 but one 70 GiB sample on GPU 1
    at `spike_at`; and one trainer_log line per 10 samples, its loss falling (`loss`)."""
    lines = range(first, first + n)
    gpus = [0, 1] * n
    used = [10 * GiB + (g * GiB) for g in gpus]
    if spike_at is not None and first <= spike_at < first + n:
        used[2 * (spike_at - first) + 1] = 70 * GiB
    memory = {
        "line": [ln for ln in lines for _ in (0, 1)],
        "t": [T0 + ln for ln in lines for _ in (0, 1)],
        "gpu": gpus,
        "used_bytes": used,
        "total_bytes": [80 * GiB] * (2 * n),
    }
    points = [ln for ln in lines if ln % 10 == 0]
    batch = {
        "seq": seq,
        "node": node,
        "memory": memory,
        "metrics": [
            {"line": p // 10, "t": T0 + p, "raw": json.dumps({"current_steps": p // 10 + 1, "loss": loss(p)})}
            for p in points
        ],
    }
    r = app.api.post(f"/api/jobs/{job_id}/telemetry", json=batch, headers=AUTH)
    assert r.status_code == 200, r.text


@pytest.fixture
def steps():
    """VM steps SQLite runs for the statements of a block, on an engine of our own over the app's file."""

    class Counter:
        n = 0

    def counted(app):
        engine = make_engine(app.settings.db_path)

        @event.listens_for(engine, "connect")
        def _count(dbapi, _record):
            def tick() -> int:
                Counter.n += 1
                return 0  # go on

            dbapi.set_progress_handler(tick, 1)

        def run(job_id: int) -> tuple[dict, int]:
            Counter.n = 0
            (row,) = feed.job_rows(engine, [job_id])
            return row, Counter.n

        return run

    return counted


def test_a_team_row_costs_the_same_after_a_long_run_and_survives_a_restart(app_factory, assets, steps):
    app = app_factory()

    def job(name: str) -> int:
        made = create_job(
            app.engine,
            app.settings,
            config=demo_config(assets),
            name=name,
            gpus=2,
            node_gpus=2,
            runner_token=RUNNER,
        )
        return made.id

    short, long, longest = job("short"), job("long"), job("longest")
    post(app, short, 0, first=0, n=20, node="gpu-node-7", spike_at=11)  # a node named: its own tiles
    for seq in range(6):  # 500 samples a GPU and batch; the spike early in each run
        if seq < 2:
            post(app, long, seq, first=seq * 500, n=500, spike_at=123)
        post(app, longest, seq, first=seq * 500, n=500, spike_at=123)

    read = steps(app)

    # The alert engine judges each job in its own thread, after ingest: wait for both long runs' spikes
    # to be judged (a badge that never comes, or never agrees, fails here).
    def judged() -> bool:
        badge = read(long)[0]["alerts"]
        return bool(badge["open"]) and badge == read(longest)[0]["alerts"]

    until(judged, "both long runs' alerts, alike")
    (row_s, _), (row_l, cost_l), (row_x, cost_x) = read(short), read(long), read(longest)
    for row in (row_s, row_l, row_x):
        assert row["peak_vram_bytes"] == 70 * GiB and row["total_vram_bytes"] == 80 * GiB
    assert (row_s["last_loss"], row_l["last_loss"], row_x["last_loss"]) == (loss(10), loss(990), loss(2990))
    assert row_l["alerts"] == row_x["alerts"]  # the same badge: what differs is the history's length
    # Three times the samples, the same work (a max() over them took three times as many steps).
    assert cost_x <= cost_l * 1.05, (cost_l, cost_x)

    app.stop()
    with sqlite3.connect(app.settings.db_path) as db:  # the alert engine saved what it followed, stopping
        saved = dict(db.execute("SELECT job_id, upto_memory FROM alert_states").fetchall())
    assert {long, longest} <= set(saved) and all(upto > 0 for upto in saved.values())
    again = steps(app_factory())
    assert [again(j)[0]["peak_vram_bytes"] for j in (short, long, longest)] == [70 * GiB] * 3
    assert again(longest)[0]["last_loss"] == loss(2990)


def test_a_team_row_is_kept_by_ingest_and_read_without_the_run(app_factory, assets):
    """The row's peak, device size and last loss are kept as batches are stored, whatever order they
    come in or how often (a replayed old batch, one sent twice, a late one holding the peak): equal to
    what the stored series say, read without touching them, and the same after a restart."""
    app = app_factory()
    job = create_job(
        app.engine,
        app.settings,
        config=demo_config(assets),
        name="kept",
        gpus=2,
        node_gpus=2,
        runner_token=RUNNER,
    ).id
    rnd = random.Random(21)
    used = {ln: [rnd.randint(5 * GiB, 40 * GiB) for _ in (0, 1)] for ln in range(610)}
    used[123][1] = 77 * GiB  # the peak, in a batch that comes last
    losses = {ln: rnd.uniform(0.5, 3.0) for ln in range(0, 610, 10)}

    def batch(seq: int, lines: range, *, nan_at: int | None = None) -> None:
        memory = {
            "line": [2 * ln + g for ln in lines for g in (0, 1)],
            "t": [T0 + ln for ln in lines for _ in (0, 1)],
            "gpu": [g for _ in lines for g in (0, 1)],
            "used_bytes": [used[ln][g] for ln in lines for g in (0, 1)],
            "total_bytes": [80 * GiB] * (2 * len(lines)),
        }
        metrics = [
            {
                "line": ln // 10,
                "t": T0 + ln,
                "raw": json.dumps(
                    {"current_steps": ln // 10 + 1, "loss": math.nan if ln == nan_at else losses[ln]}
                ),
            }
            for ln in lines
            if ln in losses
        ]
        r = app.api.post(
            f"/api/jobs/{job}/telemetry",
            json={"seq": seq, "memory": memory, "metrics": metrics},
            headers=AUTH,
        )
        assert r.status_code == 200, r.text

    order = [range(k, k + 50) for k in range(150, 600, 50)]
    for seq, lines in enumerate(order):
        batch(seq, lines)
    batch(3, order[3])  # sent twice
    batch(20, range(100, 150))  # a replayed old batch: the peak, and older lines than the newest
    batch(21, range(0, 100))

    def truth() -> dict:
        with app.engine.connect() as c:
            peak, size = c.execute(text("SELECT max(used_bytes), max(total_bytes) FROM memory_samples")).one()
            last = c.execute(
                text("SELECT loss FROM metric_points WHERE job_id = :j ORDER BY line DESC LIMIT 1"),
                {"j": job},
            ).scalar()
        return {"peak_vram_bytes": peak, "total_vram_bytes": size, "last_loss": last, "nonfinite": None}

    def row(engine) -> tuple[dict, set[str]]:
        """The row as the team feed reads it, and the tables that read touched."""
        read: set[str] = set()

        @event.listens_for(engine, "connect")
        def _watch(dbapi, _record):
            def seen(action, table, *_):
                if action == sqlite3.SQLITE_READ:
                    read.add(table)
                return sqlite3.SQLITE_OK

            dbapi.set_authorizer(seen)

        engine.dispose()  # new connections, watched
        (got,) = feed.job_rows(engine, [job])
        return {k: got[k] for k in ("peak_vram_bytes", "total_vram_bytes", "last_loss", "nonfinite")}, read

    want = truth()
    assert want["peak_vram_bytes"] == 77 * GiB and want["last_loss"] == losses[590]
    got, read = row(make_engine(app.settings.db_path))
    assert got == want
    assert not read & {"memory_samples", "chart_tiles", "metric_points"}, read

    batch(22, range(600, 610), nan_at=600)  # the newest loss is NaN: the row says so
    got, _ = row(make_engine(app.settings.db_path))
    assert got == {**want, "last_loss": None, "nonfinite": {"last_loss": "nan"}}
    app.stop()
    again = app_factory()
    assert row(make_engine(again.settings.db_path))[0] == got
