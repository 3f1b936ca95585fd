"""Live, a spike is alerted on the sample that rose, not on the one after it that shows it came back
down: the alert opens at once and follows the excursion. A rise that stays up (a level change) is
withdrawn and its alert closes; one wider than a short spike that then comes back down reopens it."""

from __future__ import annotations

import numpy as np
from sqlalchemy import text
from sqlmodel import Session, col, select

from tests.alerts.corpus import T0, TOTAL
from tests.alerts.test_streaming import new_job
from tunedeck.alerts import Limits, Series, analyze
from tunedeck.alerts.memory import MAX_SPIKE
from tunedeck.services.alerting import tracker as alerts
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Alert, LogLine, MemorySample

GiB = 1024**3


def flat(n: int, seed: int = 0) -> np.ndarray:
    return 50 * GiB + np.random.default_rng(seed).normal(0, 0.05 * GiB, n)


def live(y: np.ndarray, k: int) -> dict:
    """The findings of a running job that has stored y[: k + 1], judged at its newest sample."""
    mem = {0: [(T0 + i, int(v), TOTAL) for i, v in enumerate(y[: k + 1])]}
    s = Series(memory=mem, config={"cutoff_len": 2048}, devices=[0], running=True, now=T0 + k)
    return {f.kind: f for f in analyze(s)}


def store(engine, job_id: int, y: np.ndarray, lo: int, hi: int) -> None:
    """Samples y[lo : hi + 1] of GPU 0, one a second, into the database."""
    rows = [
        {"job_id": job_id, "line": k, "t": T0 + k, "gpu": 0, "used_bytes": int(y[k]), "total_bytes": TOTAL}
        for k in range(lo, hi + 1)
    ]
    with engine.begin() as conn:
        conn.execute(MemorySample.__table__.insert(), rows)


def test_a_spike_is_alerted_on_the_sample_that_rose():
    y = flat(200)
    y[150] += 30 * GiB
    assert "vram_spike" not in live(y, 149)
    rising = live(y, 150)["vram_spike"]
    assert rising.times == [T0 + 150] and rising.open and rising.message.endswith("(the newest is still up)")
    assert "+30.0 GiB above" in rising.message
    down = live(y, 151)["vram_spike"]  # the next sample: the same occurrence, confirmed
    assert down.times == [T0 + 150] and down.count == 1 and "still up" not in down.message


def test_a_rise_that_stays_up_is_withdrawn():
    y = flat(200)
    y[150:] += 30 * GiB  # a level change: not a spike, once the samples after the rise show it
    for k in range(150, 150 + MAX_SPIKE):
        assert live(y, k)["vram_spike"].times == [T0 + 150], k
    for k in range(150 + MAX_SPIKE, 200):
        assert "vram_spike" not in live(y, k), k
    finished = Series(memory={0: [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]}, devices=[0])
    assert "vram_spike" not in {f.kind for f in analyze(finished)}


def test_a_finished_run_never_counts_a_rise_still_up_at_its_end():
    y = flat(200)
    y[-1] += 30 * GiB
    s = Series(memory={0: [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]}, devices=[0])
    assert "vram_spike" not in {f.kind for f in analyze(s)}
    assert "vram_spike" in live(y, 199)


def test_the_alert_opens_on_the_rise_closes_on_a_level_change_and_reopens_when_it_comes_down(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    y = flat(400)
    y[150:] += 30 * GiB  # up for good from 150 (a level change) ...
    y[300:310] = y[300:310] + 30 * GiB  # ... then 10 samples higher again from that settled level
    mem = {0: [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]}
    job_id = new_job(engine, Series(memory=mem, config={}, devices=[0], running=True))
    tracker = alerts.Tracker(engine, Limits())

    def upto(i: int) -> list[Alert]:
        """The samples up to i stored, then one pass of the engine."""
        nonlocal stored
        store(engine, job_id, y, stored + 1, i)
        stored = i
        tracker.evaluate(job_id, now=T0 + i)
        with Session(engine) as s:
            return list(s.exec(select(Alert).where(Alert.kind == "vram_spike").order_by(col(Alert.id))))

    stored = -1
    assert not upto(149)
    (a,) = upto(150)  # opened by the sample that rose
    assert a.open and a.first_t == a.last_t == T0 + 150
    for i in range(151, 150 + MAX_SPIKE):
        (a,) = upto(i)
        assert a.open
    (a,) = upto(150 + MAX_SPIKE)
    assert not a.open  # it stayed up: a level change, withdrawn
    (a,) = upto(299)
    assert not a.open
    first, second = upto(300)  # a new rise: a new episode, at once
    assert second.open and second.first_t == T0 + 300 and not first.open
    _, second = upto(300 + MAX_SPIKE)
    assert not second.open  # wider than a short spike: withdrawn for now ...
    rows = upto(310)
    assert len(rows) == 2 and rows[1].open and rows[1].count == 1  # ... back down: the same episode
    assert rows[1].first_t == rows[1].last_t == T0 + 300 and "lasted 10 s" in rows[1].message


def test_a_change_to_an_open_alert_reaches_the_streams(tmp_path):
    """A second spike in the same episode changes the open alert (its count and message): the job goes
    into job_changes (live streams send it) and the engine's listener hears of it at once."""
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    y = flat(200)
    y[150] += 30 * GiB
    y[170] += 30 * GiB
    mem = {0: [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]}
    job_id = new_job(engine, Series(memory=mem, config={}, devices=[0], running=True))
    tracker = alerts.Tracker(engine, Limits())
    told: list[set[int]] = []

    def upto(lo: int, hi: int) -> tuple[list[Alert], int]:
        store(engine, job_id, y, lo, hi)
        tracker.evaluate(job_id, now=T0 + hi, on_closed=told.append)
        with Session(engine) as s:
            seq = s.exec(text("SELECT seq FROM job_changes WHERE job_id = :j").bindparams(j=job_id)).one()[0]
            return list(s.exec(select(Alert).where(Alert.kind == "vram_spike"))), seq

    (a,), seq = upto(0, 160)
    assert a.open and a.count == 1 and not told
    (a,), again = upto(161, 169)
    assert again == seq and not told  # nothing changed: nothing told
    (a,), after = upto(170, 171)
    assert a.open and a.count == 2 and after > seq and told == [{job_id}]


def test_a_pass_judges_the_job_whose_sample_rose_before_the_others(tmp_path):
    """The engine's pass over the jobs due: a spike's job first, whatever its id (on a cluster a pass
    judges dozens of jobs, and the spike's alert waited for every one before it)."""
    from tunedeck.config import Settings
    from tunedeck.services.alerting.engine import AlertEngine

    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    y = flat(100)
    mem = {0: [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]}
    oomed, spiked = (new_job(engine, Series(memory=mem, config={}, devices=[0], running=True)) for _ in "ab")
    store(engine, oomed, y, 0, 99)
    store(engine, spiked, y, 0, 99)
    worker = AlertEngine(engine, Settings(workspace=tmp_path))
    for job_id in (oomed, spiked):
        worker.tracker.evaluate(job_id, now=T0 + 99)  # their states built
    # The lower id: an out-of-memory line and ordinary samples; the higher: a spike.
    store(engine, oomed, np.r_[y, y[-3:]], 100, 102)
    line = "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    with engine.begin() as conn:
        conn.execute(
            LogLine.__table__.insert(),
            [{"job_id": oomed, "line": 0, "t": T0 + 101, "stream": "stderr", "text": line}],
        )
    store(engine, spiked, np.r_[y, y[-1] + 30 * GiB, y[-1], y[-1]], 100, 102)
    with Session(engine) as s:
        before = max([a.id for a in s.exec(select(Alert))], default=0)
    worker.notify({oomed, spiked})
    worker.run_once()
    with Session(engine) as s:
        opened = s.exec(select(Alert).where(col(Alert.id) > before).order_by(col(Alert.id))).all()
    assert [(a.job_id, a.kind) for a in opened] == [(spiked, "vram_spike"), (oomed, "oom")]
