"""The detectors fed in the ingest writer's thread from the columns it just stored find what a tracker
reading the same rows back finds; a batch whose samples were not all stored (a resend) is left to
the read back, never fed twice."""

from __future__ import annotations

import random
from functools import partial

import pytest
from sqlmodel import Session

from tests.alerts.corpus import T0, TOTAL, generate
from tests.utils.wait import DEADLINE, until
from tunedeck.services.alerting import tracker as alerts
from tunedeck.services.ingest.writer import IngestWriter
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Job, JobStatus

GiB = 1024**3
TRACES = ("single-spike", "periodic-ga4", "ramp-oom", "fragmentation")


def _running_job(tmp_path):
    """A new database holding one running job: its engine and the job's id."""
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    with Session(engine) as s:
        job = Job(name="j", spec="{}", train_yaml="", status=JobStatus.running, devices="0,1,2,3")
        s.add(job)
        s.commit()
        return engine, job.id


def _columns(mems, k: int, per: int, line: int) -> dict:
    rows = [(g, *m[i]) for i in range(k, min(k + per, len(mems[0]))) for g, m in enumerate(mems)]
    return {
        "line": list(range(line, line + len(rows))),
        "t": [r[1] for r in rows],
        "gpu": [r[0] for r in rows],
        "used_bytes": [r[2] for r in rows],
        "total_bytes": [r[3] for r in rows],
    }


def test_columns_fed_in_the_writer_find_what_the_stored_rows_find(tmp_path):
    engine, job_id = _running_job(tmp_path)
    corpus = {t.name.rsplit("-", 1)[0]: t for t in generate(3)}
    mems = [corpus[name].series.memory[0] for name in TRACES]  # one trace a device
    fed, read = (alerts.Tracker(engine, alerts.Limits()) for _ in range(2))
    for tracker in (fed, read):
        tracker.pull()
        with Session(engine) as s:
            tracker.build(s.get(Job, job_id))
    taken: list[bool] = []
    writer = IngestWriter(engine)
    writer.stored.append(lambda fresh: taken.append(fed.take(fresh)))
    writer.start()
    rng = random.Random(7)
    k = line = seq = resends = 0
    last = None
    try:
        while k < len(mems[0]):
            if last is not None and rng.random() < 0.1:  # a runner resending its last batch: nothing new
                batch, resends = last, resends + 1
            else:
                per = rng.choice((1, 3, 10, 40))
                cols = _columns(mems, k, per, line)
                cols["name"] = ["AMD Instinct MI300X"] * len(cols["line"])
                # Both forms a batch may carry: samples as rows or as columns.
                memory = cols if seq % 2 else [dict(zip(cols, v)) for v in zip(*cols.values())]
                batch = last = {"seq": seq, "memory": memory, "metrics": [], "logs": [], "states": []}
                k, line, seq = k + per, line + len(cols["line"]), seq + 1
            writer.submit(job_id, batch).result(timeout=DEADLINE)
            until(lambda: len(taken) == seq + resends, "the writer's hook to have run")
            read.pull()
    finally:
        writer.stop()
    assert resends and taken.count(False) == resends  # every resend left to the read back, nothing else
    fed.settle()  # (the samples taken and not yet handed to the detectors: an evaluation does this)
    got = fed.jobs[job_id].run.findings(running=True, now=mems[0][-1][0] + 1)
    want = read.jobs[job_id].run.findings(running=True, now=mems[0][-1][0] + 1)
    assert {f.kind for f in want} >= {"vram_spike", "vram_periodic_spikes", "vram_near_oom"}
    assert got == want
    assert fed.jobs[job_id].run.meta.gpu_names == {g: "AMD Instinct MI300X" for g in range(4)}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_each_sample_reaches_the_detectors_once_however_takes_and_passes_fall(tmp_path, seed):
    """The engine's pass may read rows a moment before the writer's take of them, a take may miss its
    turn (the state busy), and a resend is never the exact rows: whatever the order, every stored
    sample is fed once, from the columns or read back, and the findings are the read-back ones. While
    the writer has batches in hand, a pass leaves the memory samples to its takes."""
    engine, job_id = _running_job(tmp_path)
    corpus = {t.name.rsplit("-", 1)[0]: t for t in generate(seed)}
    mems = [corpus[name].series.memory[0] for name in TRACES]
    fed, read = (alerts.Tracker(engine, alerts.Limits()) for _ in range(2))
    for tracker in (fed, read):
        tracker.pull()
        with Session(engine) as s:
            tracker.build(s.get(Job, job_id))
    rng = random.Random(seed)
    busy = [False]
    fed.busy = lambda: busy[0]
    done: list[str] = []

    def hook(fresh) -> None:
        way = rng.choice(("take", "take", "pass first", "missed", "busy pass"))
        if way == "pass first":  # the engine's pass reads the rows before the take comes
            fed.pull()
        elif way == "busy pass":
            rows = fed.fed["rows"]
            busy[0] = True
            fed.pull()
            busy[0] = False
            assert fed.fed["rows"] == rows  # nothing read back while the writer holds batches
        if way != "missed":
            fed.take(fresh)
        done.append(way)

    writer = IngestWriter(engine)
    writer.stored.append(hook)
    writer.start()
    k = line = seq = stored = 0
    last = None
    try:
        while k < len(mems[0]):
            if last is not None and rng.random() < 0.1:  # a resend: nothing new, not the exact rows
                batch = last
            else:
                per = rng.choice((1, 3, 10, 40))
                cols = _columns(mems, k, per, line)
                batch = last = {"seq": seq, "memory": cols, "metrics": [], "logs": [], "states": []}
                k, line, stored = k + per, line + len(cols["line"]), stored + len(cols["line"])
            seq += 1
            writer.submit(job_id, batch).result(timeout=DEADLINE)
            until(lambda: len(done) == seq, "the writer's hook to have run")
            read.pull()
    finally:
        writer.stop()
    fed.pull()  # (what the last missed takes left)
    fed.settle()
    assert {"take", "pass first", "missed", "busy pass"} <= set(done)
    assert fed.fed["columns"] > 0 and fed.fed["rows"] > 0
    assert fed.fed["columns"] + fed.fed["rows"] == stored  # each once
    now = mems[0][-1][0] + 1
    assert fed.jobs[job_id].run.findings(running=True, now=now) == read.jobs[job_id].run.findings(
        running=True, now=now
    )


def _taking(tracker: alerts.Tracker) -> IngestWriter:
    """A started ingest writer whose stored samples the tracker takes."""
    writer = IngestWriter(tracker.engine)
    writer.stored.append(tracker.take)
    writer.start()
    return writer


def _flat_with_spike(n: int, spike: int, wobble: int) -> list[int]:
    used = [50 * GiB + (i % wobble) * 2**20 for i in range(n)]
    used[spike] += 30 * GiB
    return used


def _one_gpu(writer: IngestWriter, job_id: int, used: list[int], seq: int, lo: int, hi: int) -> None:
    """Samples lo ... hi - 1 of GPU 0, one a second, as one batch through the writer, stored."""
    cols = {
        "line": list(range(lo, hi)),
        "t": [T0 + i for i in range(lo, hi)],
        "gpu": [0] * (hi - lo),
        "used_bytes": used[lo:hi],
        "total_bytes": [TOTAL] * (hi - lo),
    }
    batch = {"seq": seq, "memory": cols, "metrics": [], "logs": [], "states": []}
    writer.submit(job_id, batch).result(timeout=DEADLINE)


def test_a_rise_in_the_columns_is_judged_before_the_detectors_are_handed_them(tmp_path):
    """Taken samples wait for the job's next evaluation to reach the detectors (fed in bigger chunks),
    but a sample well above the one before it marks the job at once, and that evaluation finds it."""
    engine, job_id = _running_job(tmp_path)
    tracker = alerts.Tracker(engine, alerts.Limits())
    tracker.pull()
    writer = _taking(tracker)
    send = partial(_one_gpu, writer, job_id, _flat_with_spike(120, 110, 7))

    try:
        send(0, 0, 60)
        assert tracker.evaluate(job_id, now=T0 + 59) == []  # (builds the state)
        send(1, 60, 110)
        until(lambda: tracker.jobs[job_id].queued == 50, "the second batch taken")
        assert tracker.fresh(job_id) and not tracker.risen(job_id)
        send(2, 110, 112)
        until(lambda: tracker.jobs[job_id].queued == 52, "the third batch taken")
        assert tracker.risen(job_id)  # noted on the take, before any detector saw the sample
        (a,) = tracker.evaluate(job_id, now=T0 + 111)
        assert a.kind == "vram_spike" and a.t == T0 + 110 and a.open
        assert tracker.jobs[job_id].queued == 0 and not tracker.risen(job_id)
    finally:
        writer.stop()


def test_samples_older_than_the_state_rebuild_it_from_the_stored_series(tmp_path):
    """A batch stored late (a runner's outbox replayed after newer samples went in) reaches the
    detectors out of time order: the job's state is built again from the stored rows, and then finds
    what a tracker reading them back finds."""
    engine, job_id = _running_job(tmp_path)
    fed, read = (alerts.Tracker(engine, alerts.Limits()) for _ in range(2))
    for tracker in (fed, read):
        tracker.pull()
    writer = _taking(fed)
    send = partial(_one_gpu, writer, job_id, _flat_with_spike(300, 250, 5))

    try:
        send(0, 0, 100)
        fed.evaluate(job_id, now=T0 + 99)  # (builds the state)
        send(1, 200, 300)
        until(lambda: fed.jobs[job_id].queued == 100, "the newer batch taken")
        send(2, 100, 200)  # older than what the state holds
        until(lambda: job_id not in fed.jobs or fed.jobs[job_id].queued == 200, "the late batch taken")
        fed.evaluate(job_id, now=T0 + 299)
    finally:
        writer.stop()
    read.evaluate(job_id, now=T0 + 299)
    now = T0 + 300
    got = fed.jobs[job_id].run.findings(running=True, now=now)
    assert got == read.jobs[job_id].run.findings(running=True, now=now)
    assert "vram_spike" in {f.kind for f in got}
    assert fed.fed["rows"] >= 300  # the state built again: every stored sample read back
