"""Alerts in a real SQLite file: fed batch by batch through the ingest writer, one open alert per
(job, kind, gpu) updated while it recurs and closed when it clears; webhooks that never block."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import ClassVar

import numpy as np
from sqlalchemy import Engine, event
from sqlmodel import Session, select

from tests.alerts.corpus import T0, generate
from tests.utils.wait import DEADLINE, until
from tunedeck.config import Settings
from tunedeck.services.alerting import engine as alerts
from tunedeck.services.alerting import tracker as detectors
from tunedeck.services.alerting.notify import Notifier
from tunedeck.services.charts import memory
from tunedeck.services.ingest.writer import IngestWriter, finish
from tunedeck.services.jobs.jobstate import JobState
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Alert, Job, JobStatus, LogLine, MemorySample

GiB = 1024**3
# An interval longer than any machine has been up: the engine's clock (monotonic time) counts from the
# boot, so "now minus never" must not read as "now minus 0", which on this interval never comes due.
LONG_S = 1e9


def new_job(engine, **kw) -> int:
    with Session(engine) as s:
        job = Job(
            name="j",
            spec="{}",
            train_yaml="gradient_accumulation_steps: 4\nper_device_train_batch_size: 2\n",
            status=JobStatus.running,
            devices="0",
            **kw,
        )
        s.add(job)
        s.commit()
        return job.id


def database(tmp_path) -> tuple[Engine, int]:
    """A real SQLite file with one running job."""
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    return engine, new_job(engine)


def samples(job_id: int, y: np.ndarray) -> list[dict]:
    """GPU 0's rows of y, one a second from T0."""
    return [
        {"job_id": job_id, "line": i, "t": T0 + i, "gpu": 0, "used_bytes": int(v), "total_bytes": 192 * GiB}
        for i, v in enumerate(y)
    ]


def batches(trace, per: int = 10):
    """The trace's samples and points as runner batches of `per` seconds each."""
    mem = trace.series.memory[0]
    pts = trace.series.points
    for seq, k in enumerate(range(0, len(mem), per)):
        chunk = mem[k : k + per]
        t_end = chunk[-1][0]
        yield (
            t_end,
            {
                "seq": seq,
                "memory": [
                    {
                        "line": k + i,
                        "t": t,
                        "gpu": 0,
                        "used_bytes": u,
                        "total_bytes": tot,
                        "name": "AMD Instinct MI300X",
                    }
                    for i, (t, u, tot) in enumerate(chunk)
                ],
                "metrics": [
                    {"line": i, "t": p.t, "raw": json.dumps({"current_steps": p.step, "loss": p.loss})}
                    for i, p in enumerate(pts)
                    if chunk[0][0] <= p.t <= t_end
                ],
                "logs": [],
                "states": [],
            },
        )


def open_alerts(engine, job_id):
    with Session(engine) as s:
        return list(s.exec(select(Alert).where(Alert.job_id == job_id, Alert.open == True)))


def test_incremental_alerts_one_open_per_kind_and_gpu(tmp_path):
    engine, job_id = database(tmp_path)
    trace = next(t for t in generate(0) if t.name == "periodic-ga4-0")
    writer = IngestWriter(engine)
    writer.start()
    tracker = detectors.Tracker(engine, detectors.Limits())
    counts = []
    for t_end, batch in batches(trace):
        writer.submit(job_id, batch).result(timeout=DEADLINE)
        writer.submit(job_id, batch).result(timeout=DEADLINE)  # a resent batch changes nothing
        tracker.evaluate(job_id, now=t_end)
        rows = [a for a in open_alerts(engine, job_id) if a.kind == "vram_periodic_spikes"]
        assert len(rows) <= 1
        counts += [r.count for r in rows]
    assert counts == sorted(counts) and counts[-1] > 50  # one alert, updated while the spikes recur
    with Session(engine) as s:
        kinds = [a.kind for a in s.exec(select(Alert).where(Alert.job_id == job_id))]
        assert len(s.exec(select(MemorySample)).all()) == len(trace.series.memory[0])
    assert kinds.count("vram_periodic_spikes") == 1
    # Live, the first spikes are single ones until they recur: that alert is closed, not duplicated.
    assert not any(a.kind == "vram_spike" for a in open_alerts(engine, job_id))
    (a,) = [a for a in open_alerts(engine, job_id) if a.kind == "vram_periodic_spikes"]
    assert a.gpu == 0 and a.severity == "warning" and "gradient_accumulation_steps is 4" in a.suggestion
    assert a.change is None
    # The job ends: nothing holds any more.
    with JobState(engine).begin() as conn:
        finish(conn, job_id, status=JobStatus.succeeded, exit_code=0, error=None)
    tracker.evaluate(job_id)
    assert open_alerts(engine, job_id) == []
    writer.stop()


def test_spike_alert_closes_and_reopens_as_a_new_episode(tmp_path):
    engine, job_id = database(tmp_path)
    rng = np.random.default_rng(0)
    y = 50 * GiB + rng.normal(0, 0.05 * GiB, 900)
    y[100] += 30 * GiB
    y[800] += 30 * GiB
    rows = samples(job_id, y)
    tracker = detectors.Tracker(engine, detectors.Limits(hold_s=300))

    def upto(i: int):
        with engine.begin() as conn:
            conn.execute(
                MemorySample.__table__.insert(), [r for r in rows if r["line"] <= i and r["line"] > upto.done]
            )
        upto.done = i
        tracker.evaluate(job_id, now=T0 + i)
        with Session(engine) as s:
            return list(s.exec(select(Alert).where(Alert.job_id == job_id, Alert.kind == "vram_spike")))

    upto.done = -1
    (a,) = upto(101)
    assert a.open and a.count == 1 and a.t == T0 + 100
    assert "+30.0 GiB above the 50.0 GiB baseline" in a.message
    (a,) = upto(500)  # hold time passed without a new spike: closed
    assert not a.open
    first, second = upto(801)  # it recurs: a new episode, the old one stays closed
    assert not first.open and second.open and second.first_t == T0 + 800 and second.count == 1


def test_an_evaluation_that_finds_what_is_stored_writes_nothing(tmp_path):
    """Judged again with nothing new, a job's alerts are not read or written again; a change is."""
    engine, job_id = database(tmp_path)
    y = 50 * GiB + np.random.default_rng(1).normal(0, 0.05 * GiB, 300)
    y[[100, 250]] += 30 * GiB
    rows = samples(job_id, y)
    statements: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    tracker = detectors.Tracker(engine, detectors.Limits())

    def judged(upto: int) -> list[str]:
        new = [r for r in rows if judged.done < r["line"] <= upto]
        if new:
            with engine.begin() as conn:
                conn.execute(MemorySample.__table__.insert(), new)
        judged.done = upto
        statements.clear()
        tracker.evaluate(job_id, now=T0 + upto)
        return [q for q in statements if "alerts" in q]

    judged.done = -1
    assert judged(120)  # the spike: stored
    assert judged(120) == []  # nothing new
    assert judged(251)  # another spike: the alert's count changes
    with Session(engine) as s:
        (a,) = s.exec(select(Alert).where(Alert.job_id == job_id))
    assert a.kind == "vram_spike" and a.count == 2 and a.open


def test_downsampling_keeps_every_peak(tmp_path):
    engine, job_id = database(tmp_path)
    trace = next(t for t in generate(1) if t.name == "periodic-ga8-1")
    writer = IngestWriter(engine)
    writer.start()
    for _, batch in batches(trace, per=100):
        writer.submit(job_id, batch).result(timeout=DEADLINE)
    writer.stop()
    with Session(engine) as s:
        rows, nxt, reduced = memory.memory_page(
            s, job_id=job_id, gpu=None, after=None, max_points=100, t0=None, t1=None, limit=1000
        )
        assert reduced and len(rows) <= 200
        kept = {r.t for r in rows}
        assert set(trace.spike_times) <= kept  # 36 spikes in 600 samples: every one in ≤ 200 points
        t0 = trace.spike_times[10] - 5
        win, _, _ = memory.memory_page(
            s, job_id=job_id, gpu=0, after=None, max_points=None, t0=t0, t1=t0 + 10, limit=1000
        )
        assert [r.t for r in win] == [t0 + i for i in range(11)]
        page, nxt, reduced = memory.memory_page(
            s, job_id=job_id, gpu=None, after=None, max_points=None, t0=None, t1=None, limit=50
        )
        assert not reduced and len(page) == 50 and nxt == page[-1].id


class Hook(BaseHTTPRequestHandler):
    got: ClassVar[list] = []
    fail_first = True

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if Hook.fail_first:
            Hook.fail_first = False
            self.send_response(503)
        else:
            Hook.got.append(body)
            self.send_response(200)
        self.end_headers()

    def log_message(self, *a) -> None:
        pass


def test_webhooks_are_retried_and_never_block(tmp_path):
    http = HTTPServer(("127.0.0.1", 0), Hook)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    engine, job_id = database(tmp_path)
    settings = Settings(
        workspace=tmp_path,
        webhook_urls=[f"http://127.0.0.1:{http.server_port}/hook", "http://127.0.0.1:9/dead"],
        webhook_min_severity="critical",
        webhook_retries=2,
    )
    notifier = Notifier(settings, engine)
    notifier.start()
    try:
        trace = next(t for t in generate(0) if t.name == "ramp-oom-0")
        engine_thread = alerts.AlertEngine(engine, settings, on_new=notifier.alerts_opened)
        writer = IngestWriter(engine, state=JobState(engine, notifier=notifier, alerts=engine_thread))
        writer.start()
        writer.listeners.append(engine_thread.notify)
        engine_thread.start()
        for _, batch in batches(trace, per=50):
            writer.submit(job_id, batch).result(timeout=DEADLINE)  # returns while webhooks still retry
        writer.submit(
            job_id,
            {
                "seq": 99,
                "logs": [
                    {
                        "line": 0,
                        "t": trace.series.logs[0][0],
                        "stream": "stderr",
                        "text": trace.series.logs[0][1],
                    }
                ],
                "states": [
                    {
                        "event": "exited",
                        "exit_code": 1,
                        "cancelled": False,
                        "cause": "out of memory: HIP out of memory",
                    }
                ],
            },
        ).result(timeout=DEADLINE)
        until(lambda: len(Hook.got) >= 3, "three delivered webhooks", timeout=180)
        engine_thread.stop()
        writer.stop()
    finally:
        notifier.stop()
        http.shutdown()
    events = {(g["event"], g.get("kind")) for g in Hook.got}
    assert ("alert", "vram_near_oom") in events and ("job_finished", None) in events
    assert all(g["text"] for g in Hook.got)
    assert not any(g.get("severity") in ("info", "warning") for g in Hook.got)  # below the chosen severity
    done = next(g for g in Hook.got if g["event"] == "job_finished")
    assert done["text"] == f"tunedeck: job {job_id} (j) failed: out of memory: HIP out of memory"


def test_a_spike_is_judged_at_once_whatever_output_lines_came_before(tmp_path):
    """The interval between two judgements of a job holds back output lines, never a spike: its
    sample is judged on the engine's next pass, not an interval later. A job never judged is judged at
    the first pass, however long the interval and however recent the boot."""
    engine, job_id = database(tmp_path)
    y = 50 * GiB + np.random.default_rng(1).normal(0, 0.05 * GiB, 102)
    y[100] += 30 * GiB
    rows = samples(job_id, y)
    judge = alerts.AlertEngine(engine, Settings(workspace=tmp_path, alert_interval_s=LONG_S))

    def store(table, items) -> list[Alert]:
        with engine.begin() as conn:
            conn.execute(table.insert(), items)
        judge.notify({job_id})
        judge.run_once()
        with Session(engine) as s:
            return list(s.exec(select(Alert).where(Alert.job_id == job_id, Alert.kind == "vram_spike")))

    assert store(MemorySample.__table__, rows[:100]) == []
    assert job_id in judge.tracker.jobs  # the first judgement built the state
    line = {"job_id": job_id, "line": 0, "t": T0 + 100, "stream": "stderr", "text": "step 1"}
    assert store(LogLine.__table__, [line]) == []  # output alone: left for the interval
    assert judge.tracker.jobs[job_id].upto["logs"] > 0  # ... though already read
    (a,) = store(MemorySample.__table__, rows[100:])
    assert a.open and a.t == T0 + 100


def test_a_rise_is_judged_at_once_though_the_job_was_judged_just_before(tmp_path):
    """A job is judged at most once an interval, but a sample well above the one before it (a spike's
    first) is judged on the engine's next pass: here the interval outlasts any uptime."""
    engine, job_id = database(tmp_path)
    y = 50 * GiB + np.random.default_rng(2).normal(0, 0.05 * GiB, 102)
    y[100] += 30 * GiB
    rows = samples(job_id, y)
    judge = alerts.AlertEngine(engine, Settings(workspace=tmp_path, alert_interval_s=LONG_S))

    def store(part) -> list[Alert]:
        with engine.begin() as conn:
            conn.execute(MemorySample.__table__.insert(), part)
        judge.notify({job_id})
        judge.run_once()
        with Session(engine) as s:
            return list(s.exec(select(Alert).where(Alert.job_id == job_id, Alert.kind == "vram_spike")))

    assert store(rows[:50]) == []
    assert job_id in judge.tracker.jobs  # the first judgement built the state
    assert store(rows[50:99]) == [] and judge.tracker.fresh(job_id)  # ordinary samples wait
    assert store(rows[99:100]) == [] and judge.tracker.fresh(job_id)
    (a,) = store(rows[100:101])  # the rise does not
    assert a.open and a.t == T0 + 100


def test_samples_at_the_near_oom_share_are_judged_at_once(tmp_path):
    """A card held near full is judged on each such sample, whatever the interval: the near-OOM alert
    comes with its third sample in a row, as it would if every sample were judged."""
    engine, job_id = database(tmp_path)
    y = 150 * GiB + np.random.default_rng(4).normal(0, 0.05 * GiB, 103)
    y[100:] = 0.97 * 192 * GiB  # (samples() reports a 192 GiB card)
    rows = samples(job_id, y)
    judge = alerts.AlertEngine(engine, Settings(workspace=tmp_path, alert_interval_s=LONG_S))

    def store(part) -> list[Alert]:
        with engine.begin() as conn:
            conn.execute(MemorySample.__table__.insert(), part)
        judge.notify({job_id})
        judge.run_once()
        with Session(engine) as s:
            return list(s.exec(select(Alert).where(Alert.job_id == job_id, Alert.kind == "vram_near_oom")))

    assert store(rows[:99]) == []
    assert store(rows[99:100]) == [] and judge.tracker.fresh(job_id)  # an ordinary sample waits
    assert store(rows[100:101]) == [] and not judge.tracker.fresh(job_id)  # judged: one near full
    assert store(rows[101:102]) == [] and not judge.tracker.fresh(job_id)
    (a,) = store(rows[102:103])  # the third in a row
    assert a.open and a.severity == "critical"


def test_the_log_prefilter_lets_every_oom_flush_and_save_line_through():
    """The engine reads only log lines its LIKE prefilter passes: each kind of line the detectors know
    must pass it (a line the regex knows and the prefilter drops is an OOM nobody is told of)."""
    import sqlite3

    from tunedeck.alerts.training import FLUSH, OOM, SAVE
    from tunedeck.services.alerting.tracker import LOG_PATTERNS

    lines = [
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
        "HIP out of memory. GPU 0 has a total capacity of 191.98 GiB",
        "RuntimeError: [enforce fail at alloc_cpu.cpp:117] can't allocate memory: you tried to allocate 1 bytes",
        "OSError: [Errno 12] Cannot allocate memory",
        "MemoryError",
        "memory allocation of 4194304 bytes failed",
        "RuntimeError: can't start new thread",
    ]
    assert all(OOM.search(line) for line in lines)
    assert len(lines) >= len(OOM.pattern.split("|"))  # one example per alternative of the regex
    flushes = [ln for ln in ["3 pytorch allocator cache flushes since last step"] if FLUSH.search(ln)]
    saves = [
        ln
        for ln in ["[INFO|trainer.py:3984] Saving model checkpoint to saves/x/checkpoint-500"]
        if SAVE.search(ln)
    ]
    assert flushes and saves
    db = sqlite3.connect(":memory:")
    where = " OR ".join("text LIKE ?" for _ in LOG_PATTERNS)
    for line in lines + flushes + saves:
        assert db.execute(f"SELECT ? AS text WHERE {where}", (line, *LOG_PATTERNS)).fetchone(), line


def saved_rows(engine) -> dict[int, int]:
    with engine.connect() as conn:
        return dict(conn.exec_driver_sql("SELECT job_id, upto_memory FROM alert_states").all())


def test_the_engine_saves_what_it_follows_and_a_restarted_one_resumes_it(tmp_path):
    """A state is saved once it is `alert_state_save_s` old (one a pass) and by the engine's final
    pass at shutdown; the next engine reads only the rows stored after it, and finds what a build
    from the whole series finds."""
    engine, job_id = database(tmp_path)
    y = 50 * GiB + np.random.default_rng(3).normal(0, 0.05 * GiB, 400)
    y[350] += 30 * GiB
    rows = samples(job_id, y)
    with engine.begin() as conn:
        conn.execute(MemorySample.__table__.insert(), rows[:300])
    never = alerts.AlertEngine(engine, Settings(workspace=tmp_path, alert_state_save_s=0))
    never.notify({job_id})
    never.start()
    until(lambda: job_id in never.tracker.jobs, "the engine following the job")
    never.stop()
    assert saved_rows(engine) == {}  # 0: never saved

    first = alerts.AlertEngine(engine, Settings(workspace=tmp_path, alert_state_save_s=1e-9))
    first.notify({job_id})
    first.run_once()  # builds the state, which is then due at once
    assert first.tracker.rows == 300 and saved_rows(engine) == {job_id: 300}  # (ids count from 1)
    with engine.begin() as conn:
        conn.execute(MemorySample.__table__.insert(), rows[300:340])
    first.notify({job_id})
    first.start()
    until(lambda: first.tracker.jobs[job_id].upto["memory"] >= 340, "the engine fed the new rows")
    first.stop()  # the final pass saves it with every row it was fed
    assert saved_rows(engine) == {job_id: 340}

    with engine.begin() as conn:
        conn.execute(MemorySample.__table__.insert(), rows[340:])
    second = alerts.AlertEngine(engine, Settings(workspace=tmp_path))
    second.notify({job_id})
    second.run_once()
    assert second.tracker.rows == 60  # the rows after the saved state, not the 400
    with engine.begin() as conn:
        conn.exec_driver_sql("DELETE FROM alert_states")
    whole = detectors.Tracker(engine, second.limits)
    with Session(engine) as s:
        whole.build(s.get(Job, job_id) or Job())
    found = second.tracker.jobs[job_id].run.findings(running=True, now=T0 + 400)
    again = whole.jobs[job_id].run.findings(running=True, now=T0 + 400)
    assert [vars(f) for f in found] == [vars(f) for f in again]
    assert any(f.kind == "vram_spike" for f in found)
