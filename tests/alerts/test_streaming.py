"""The detectors consume a series as it grows: fed in random-sized chunks (live ingest) they find
exactly what they find in the whole series at once (an import); and the server's tracker, reading
only the rows stored since its last pass, ends where a rebuild from the stored series starts."""

from __future__ import annotations

import json
import random
import zlib

import numpy as np
import pytest
import yaml
from sqlalchemy import func, select
from sqlmodel import Session

from tests.alerts.corpus import T0, TOTAL, corpus, generate, gradient_corpus
from tunedeck.alerts import Limits, Run, Series, analyze
from tunedeck.services.alerting import tracker as alerts
from tunedeck.services.ingest.writer import apply_batch
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Job, JobStatus, MemorySample

GiB = 1024**3


def key(findings) -> list[tuple]:
    return [
        (f.kind, f.gpu, f.times, f.count, f.first, f.step, f.message, f.suggestion, f.open) for f in findings
    ]


def chunked(s: Series, rng: random.Random) -> Run:
    """The series fed the way ingest feeds it: each stream in chunks of random size, the streams
    interleaved at random, findings read now and then along the way."""
    run = Run(s)
    left = {("memory", g): list(xs) for g, xs in s.memory.items()}
    left["points"], left["logs"] = list(s.points), list(s.logs)
    while any(left.values()):
        name = rng.choice([k for k, v in left.items() if v])
        n = rng.choice([1, 1, 2, 3, 5, 8, 13, 40, 150])
        part, left[name] = left[name][:n], left[name][n:]
        if name == "points":
            run.feed_points(part)
        elif name == "logs":
            run.feed_logs(part)
        else:
            run.feed_memory(name[1], [x[0] for x in part], [x[1] for x in part], [x[2] for x in part])
        if rng.random() < 0.1:
            run.findings(running=True)
    return run


@pytest.mark.parametrize("seed", range(6))
def test_streaming_in_random_chunks_equals_the_whole_series(seed):
    rng = random.Random(seed)
    for tr in generate(seed) + gradient_corpus([seed]):
        whole = analyze(tr.series)
        assert {f.kind for f in whole} == tr.labels, tr.name
        assert key(chunked(tr.series, rng).findings(running=tr.series.running, now=tr.series.now)) == key(
            whole
        ), tr.name


def test_the_first_samples_agree_at_every_length():
    """The first samples are judged on what there is so far; each prefix, fed sample by sample,
    reads the same as that prefix fed whole."""
    tr = next(t for t in generate(1) if t.name.startswith("single-spike"))
    y = [
        (T0 + i, int(v * GiB), TOTAL)
        for i, v in enumerate([2, 40, 70, 40, 40, 41, 40, 40, 40, 41, 40, 40, 90, 40])
    ]
    s = Series(memory={0: y}, config=tr.series.config, devices=[0], running=True)
    run = Run(s)
    for k, x in enumerate(y):
        run.feed_memory(0, [x[0]], [x[1]], [x[2]])
        prefix = Series(memory={0: y[: k + 1]}, config=s.config, devices=[0], running=True)
        assert key(run.findings(running=True)) == key(analyze(prefix)), k


# ------------------------------------------------------------------ through the database


def new_job(engine, series: Series) -> int:
    with Session(engine) as s:
        job = Job(
            name="j",
            spec="{}",
            train_yaml=yaml.safe_dump(series.config),
            status=JobStatus.running,
            ds_config=json.dumps(series.ds) if series.ds else None,
            devices=",".join(map(str, series.devices)),
        )
        s.add(job)
        s.commit()
        return job.id


def store(
    engine,
    job_id: int,
    trace,
    rng: random.Random,
    tracker: alerts.Tracker,
    *,
    until: float | None = None,
    since: float | None = None,
):
    """The trace's rows (those after `since`, up to `until`) in runner batches of random size, the
    tracker evaluating after each."""
    s = trace.series

    def within(t: float) -> bool:
        return (until is None or t <= until) and (since is None or t > since)

    mem = [(i, x) for i, x in enumerate(s.memory[0]) if within(x[0])]
    pts = [(i, p) for i, p in enumerate(s.points) if within(p.t)]
    logs = [(i, x) for i, x in enumerate(s.logs) if within(x[0])]
    seq = 0
    while mem or pts or logs:
        n = rng.choice([1, 4, 9, 30, 120])
        horizon = mem[min(n, len(mem)) - 1][1][0] if mem else float("inf")
        batch = {
            "seq": seq,
            "memory": [
                {
                    "line": i,
                    "t": t,
                    "gpu": 0,
                    "used_bytes": u,
                    "total_bytes": tot,
                    "name": "AMD Instinct MI300X",
                }
                for i, (t, u, tot) in mem[:n]
            ],
            "metrics": [
                {"line": i, "t": p.t, "raw": json.dumps({"current_steps": p.step, "loss": p.loss})}
                for i, p in pts
                if p.t <= horizon
            ],
            "logs": [
                {"line": i, "t": t, "stream": "stdout", "text": x} for i, (t, x) in logs if t <= horizon
            ],
        }
        mem, seq = mem[n:], seq + 1
        pts = [(i, p) for i, p in pts if p.t > horizon]
        logs = [(i, x) for i, x in logs if x[0] > horizon]
        with engine.begin() as conn:
            apply_batch(conn, job_id, batch)
        tracker.evaluate(job_id, now=horizon if horizon != float("inf") else None)


@pytest.mark.parametrize("name", ["fragmentation-0", "periodic-ga4-0", "hang-1", "nan-2", "divergence-3"])
def test_the_tracker_fed_batch_by_batch_equals_a_rebuild_and_the_whole_series(tmp_path, name):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    tr = next(t for t in corpus(range(4)) if t.name == name)
    job_id = new_job(engine, tr.series)
    tracker = alerts.Tracker(engine, Limits())
    store(engine, job_id, tr, random.Random(name), tracker)
    end = max(tr.series.memory[0][-1][0], tr.series.points[-1].t)
    live = key(tracker.jobs[job_id].run.findings(running=True, now=end))
    restarted = alerts.Tracker(engine, Limits())  # a server start: the state comes from the stored series
    restarted.evaluate(job_id, now=end)
    assert key(restarted.jobs[job_id].run.findings(running=True, now=end)) == live
    whole = Series(**{**tr.series.__dict__, "running": True, "now": end})
    assert key(analyze(whole)) == live
    assert {k[0] for k in live} == tr.labels


def test_the_tracker_reads_only_the_rows_stored_since_its_last_pass(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    s = next(t for t in generate(0) if t.name.startswith("single-spike")).series
    job_id, other = new_job(engine, s), new_job(engine, s)
    rows = [
        {"job_id": job_id, "line": i, "t": t, "gpu": 0, "used_bytes": u, "total_bytes": tot}
        for i, (t, u, tot) in enumerate(s.memory[0])
    ]
    with engine.begin() as conn:
        conn.execute(MemorySample.__table__.insert(), rows[:500])
        conn.execute(MemorySample.__table__.insert(), [{**r, "job_id": other} for r in rows])
    tracker = alerts.Tracker(engine, Limits())
    tracker.evaluate(job_id, now=rows[499]["t"])
    assert tracker.rows == 500  # built from its own stored series only
    for k in range(500, 600, 20):
        before = tracker.rows
        with engine.begin() as conn:
            conn.execute(MemorySample.__table__.insert(), rows[k : k + 20])
        tracker.evaluate(job_id, now=rows[k + 19]["t"])
        assert tracker.rows - before == 20
    final = tracker.jobs[job_id].run.findings(running=True, now=rows[-1]["t"])
    stored = Series(memory=s.memory, config=s.config, devices=s.devices, running=True, now=rows[-1]["t"])
    assert key(final) == key(analyze(stored)) and {f.kind for f in final} == {"vram_spike", "vram_plateau"}


def test_rows_stored_out_of_order_rebuild_the_state(tmp_path):
    """A runner's outbox replays a lost batch after newer ones were stored: the samples come back
    with newer ids but older times, and the state is built again from the stored series."""
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    rng = np.random.default_rng(0)
    y = 50 * GiB + rng.normal(0, 0.05 * GiB, 300)
    y[120:126] += 30 * GiB  # six samples wide, inside the batch that comes late
    s = Series(
        memory={0: [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]}, config={}, devices=[0], running=True
    )
    job_id = new_job(engine, s)
    rows = [
        {"job_id": job_id, "line": i, "t": t, "gpu": 0, "used_bytes": u, "total_bytes": tot}
        for i, (t, u, tot) in enumerate(s.memory[0])
    ]
    tracker = alerts.Tracker(engine, Limits())
    for part in (rows[:100], rows[150:], rows[100:150]):
        with engine.begin() as conn:
            conn.execute(MemorySample.__table__.insert(), part)
        tracker.evaluate(job_id, now=T0 + 300)
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(MemorySample.__table__)).scalar() == 300
    got = tracker.jobs[job_id].run.findings(running=True, now=T0 + 300)
    assert [(f.kind, f.times) for f in got if f.kind == "vram_spike"] == [("vram_spike", [T0 + 120])]
    assert key(got) == key(analyze(Series(**{**s.__dict__, "now": T0 + 300})))


# ------------------------------------------------------------------ a saved state across a restart


def saved_upto(engine, job_id: int) -> tuple[int, int, int] | None:
    with engine.connect() as conn:
        row = conn.exec_driver_sql(
            "SELECT upto_memory, upto_metrics, upto_logs FROM alert_states WHERE job_id = ?", (job_id,)
        ).one_or_none()
    return None if row is None else tuple(row)


def rows_after(engine, job_id: int, upto: tuple[int, int, int]) -> int:
    """The rows a state saved at `upto` is fed at a restart (log lines: those the detectors read)."""
    like = " OR ".join("text LIKE ?" for _ in alerts.LOG_PATTERNS)
    with engine.connect() as conn:
        return sum(
            conn.exec_driver_sql(sql, (job_id, lo, *extra)).scalar_one()
            for sql, lo, extra in (
                ("SELECT count(*) FROM memory_samples WHERE job_id = ? AND id > ?", upto[0], ()),
                ("SELECT count(*) FROM metric_points WHERE job_id = ? AND id > ?", upto[1], ()),
                (
                    f"SELECT count(*) FROM log_lines WHERE job_id = ? AND id > ? AND ({like})",
                    upto[2],
                    alerts.LOG_PATTERNS,
                ),
            )
        )


@pytest.mark.parametrize("name", ["fragmentation-0", "hang-1", "nan-2", "divergence-3"])
def test_a_restart_resumes_the_saved_state_from_the_rows_after_it(tmp_path, name):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    tr = next(t for t in corpus(range(4)) if t.name == name)
    job_id = new_job(engine, tr.series)
    tracker = alerts.Tracker(engine, Limits())
    mid = tr.series.memory[0][len(tr.series.memory[0]) // 2][0]
    store(engine, job_id, tr, random.Random(name), tracker, until=mid)
    assert tracker.save(job_id)
    upto = saved_upto(engine, job_id)
    assert upto is not None and upto[0] > 0
    store(engine, job_id, tr, random.Random(name), tracker, since=mid)  # the rest, by the same server
    end = max(tr.series.memory[0][-1][0], tr.series.points[-1].t)
    live = key(tracker.jobs[job_id].run.findings(running=True, now=end))

    restarted = alerts.Tracker(engine, Limits())
    restarted.evaluate(job_id, now=end)
    assert restarted.rows == rows_after(engine, job_id, upto) < rows_after(engine, job_id, (0, 0, 0))
    assert key(restarted.jobs[job_id].run.findings(running=True, now=end)) == live
    assert {k[0] for k in live} == tr.labels


def test_a_saved_state_that_cannot_be_used_is_dropped_and_the_series_read_whole(tmp_path):
    """Saved by other detector code, under other alert settings, or followed by rows it cannot take
    (a late batch older than its samples): the state comes from the stored series, as it did before."""
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    tr = next(t for t in corpus(range(1)) if t.name == "fragmentation-0")
    job_id = new_job(engine, tr.series)
    tracker = alerts.Tracker(engine, Limits())
    store(engine, job_id, tr, random.Random(1), tracker)
    end = tr.series.memory[0][-1][0]
    live = key(tracker.jobs[job_id].run.findings(running=True, now=end))
    whole = rows_after(engine, job_id, (0, 0, 0))

    def restart(limits: Limits = Limits()) -> alerts.Tracker:
        assert tracker.save(job_id)
        again = alerts.Tracker(engine, limits)
        again.evaluate(job_id, now=end)
        return again

    assert restart().rows == 0  # (saved after the last row: nothing to read)
    with engine.begin() as conn:  # the same state, as other detector code would have saved it
        blob = conn.exec_driver_sql("SELECT state FROM alert_states").scalar_one()
        doc = json.loads(zlib.decompress(blob))
        doc["code"] = "0" * 16
        conn.exec_driver_sql("UPDATE alert_states SET state = ?", (zlib.compress(json.dumps(doc).encode()),))
    again = alerts.Tracker(engine, Limits())
    again.evaluate(job_id, now=end)
    assert again.rows == whole and saved_upto(engine, job_id) is None
    assert key(again.jobs[job_id].run.findings(running=True, now=end)) == live

    other = restart(Limits(hold_s=60.0))
    assert other.rows == whole and saved_upto(engine, job_id) is None

    assert tracker.save(job_id)
    late = {"job_id": job_id, "line": 10**6, "t": tr.series.memory[0][10][0], "gpu": 0, "used_bytes": GiB}
    with engine.begin() as conn:
        conn.execute(MemorySample.__table__.insert(), [late])
    again = alerts.Tracker(engine, Limits())
    again.evaluate(job_id, now=end)
    # The late row, read after the saved state, which cannot take it; then the whole series with it.
    assert again.rows == 1 + (whole + 1) and saved_upto(engine, job_id) is None


def test_a_finished_jobs_saved_state_is_dropped(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    tr = next(t for t in corpus(range(1)) if t.name == "fragmentation-0")
    job_id = new_job(engine, tr.series)
    tracker = alerts.Tracker(engine, Limits())
    store(engine, job_id, tr, random.Random(2), tracker)
    assert tracker.save(job_id) and saved_upto(engine, job_id) is not None
    with engine.begin() as conn:
        conn.exec_driver_sql("UPDATE jobs SET status = 'succeeded' WHERE id = ?", (job_id,))
    tracker.evaluate(job_id)
    assert saved_upto(engine, job_id) is None and job_id not in tracker.jobs
