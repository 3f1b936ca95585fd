"""The ingest path on a real SQLite file: idempotent batches, progress, final states."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from pydantic import ValidationError
from sqlalchemy import Integer, func, select, text
from sqlmodel import Session

from tests.utils.wait import DEADLINE
from tunedeck.contract.lflog import COUNTS, METRICS, parse_point, seconds
from tunedeck.contract.protocol import TelemetryBatch
from tunedeck.schemas import JobOut, MetricOut
from tunedeck.services.charts.metrics import metric_series
from tunedeck.services.ingest.writer import IngestWriter, apply_batch
from tunedeck.services.live.feed import Cursor, job_events
from tunedeck.store.db import downgrade, make_engine, upgrade
from tunedeck.store.tables import Job, JobStatus, LogLine, MetricPoint

# metric_points columns that are not trainer metrics: keys, time, progress, the line as written
SERVICE_COLUMNS = ("id", "job_id", "line", "t", "step", "total_steps", "raw", "nonfinite", "extra")


def new_job(engine) -> int:  # noqa: ANN001
    with Session(engine) as s:
        job = Job(name="j", spec="{}", train_yaml="", status=JobStatus.running)
        s.add(job)
        s.commit()
        return job.id


def line(step: int, **kw) -> str:
    return json.dumps(
        {
            "current_steps": step,
            "total_steps": 10,
            "percentage": step * 10.0,
            "remaining_time": "0:01:05",
            **kw,
        }
    )


def test_pragmas_and_migrations(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    with engine.connect() as c:
        assert c.execute(text("PRAGMA journal_mode")).scalar() == "wal"
        assert c.execute(text("PRAGMA foreign_keys")).scalar() == 1
        assert c.execute(text("PRAGMA synchronous")).scalar() == 1  # NORMAL
        tables = {r[0] for r in c.execute(text("SELECT name FROM sqlite_master WHERE type='table'"))}
    assert {"jobs", "metric_points", "log_lines", "alembic_version"} <= tables
    downgrade(engine, "base")
    with engine.connect() as c:
        assert c.execute(text("SELECT count(*) FROM sqlite_master WHERE name='jobs'")).scalar() == 0


def test_batches_are_idempotent(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    job_id = new_job(engine)
    batch = {
        "seq": 0,
        "metrics": [{"line": i, "t": 1.0 + i, "raw": line(i + 1, loss=5.0 - i)} for i in range(3)],
        "logs": [{"line": 0, "t": 1.0, "stream": "stdout", "text": "hello"}],
        "states": [],
    }
    writer = IngestWriter(engine)
    writer.start()
    for _ in range(3):  # sent three times: stored once
        writer.submit(job_id, batch).result(timeout=DEADLINE)
    old = {
        "seq": 1,
        "metrics": [{"line": 0, "t": 1.0, "raw": line(1, loss=5.0)}],
        "logs": [],
        "states": [{"event": "exited", "exit_code": 0, "cancelled": False, "cause": None}],
    }
    writer.submit(job_id, old).result(timeout=DEADLINE)
    writer.stop()
    with Session(engine) as s:
        assert s.exec(select(func.count()).select_from(MetricPoint)).one()[0] == 3
        assert s.exec(select(func.count()).select_from(LogLine)).one()[0] == 1
        job = s.get(Job, job_id)
        assert job.current_steps == 3  # a replayed old line does not move progress back
        assert job.eta_seconds == 0.0 and job.status == JobStatus.succeeded
        assert job.last_batch_seq == 1


def test_exit_states():
    from tunedeck.services.ingest.writer import final_status

    assert final_status(exit_code=0, cancelled=True) == JobStatus.cancelled
    assert final_status(exit_code=-9, cancelled=False) == JobStatus.failed
    assert final_status(exit_code=0, cancelled=False) == JobStatus.succeeded
    # An exit report without a code (a runner that lost its trainer's status) proves no success.
    assert final_status(exit_code=None, cancelled=False) == JobStatus.failed


def test_parse_point():
    p = parse_point(
        json.dumps(
            {
                "current_steps": 4,
                "total_steps": 8,
                "loss": 2.5,
                "lr": 1e-4,
                "epoch": 0.5,
                "throughput": 10.5,
                "total_tokens": 300,
                "vram_allocated": 0.0,
                "remaining_time": "1 day, 2:03:04",
            }
        )
    )
    assert (p["step"], p["loss"], p["total_tokens"], p["vram_allocated"]) == (4, 2.5, 300, 0.0)
    assert p["eta_seconds"] == 26 * 3600 + 3 * 60 + 4
    assert parse_point("not json") == {}
    assert seconds("0:00:09") == 9.0 and seconds(None) is None


def test_every_reader_of_metric_points_names_the_one_list_of_columns(tmp_path):
    """Table, API schema, ingest, stream rows and chart series all use the columns of lflog.METRICS."""
    table = MetricPoint.__table__.c
    assert tuple(c.name for c in table if c.name not in SERVICE_COLUMNS) == METRICS
    assert [k for k in METRICS if isinstance(table[k].type, Integer)] == list(COUNTS)
    assert (
        tuple(k for k in MetricOut.model_fields if k not in ("id", "step", "t", "nonfinite", "extra"))
        == METRICS
    )
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    job_id = new_job(engine)
    values = {k: float(i + 1) for i, k in enumerate(METRICS)}  # a different value in every column
    with engine.begin() as c:
        apply_batch(c, job_id, {"seq": 0, "metrics": [{"line": 0, "t": 1.0, "raw": line(1, **values)}]})
    (streamed,) = [e.data for e in job_events(engine, job_id, Cursor(), limit=10)[0] if e.event == "metrics"]
    assert {k: streamed[0][k] for k in METRICS} == values
    charted = metric_series(engine, job_id=job_id, max_points=10)["series"]
    assert list(charted) == [k for k in METRICS if k != "epoch"]  # token counts too: an x axis
    assert {k: s["y"] for k, s in charted.items()} == {k: [values[k]] for k in charted}


def resumed_lines(first_step: int, n: int, *, tokens_per_step: int, total: int) -> list[str]:
    """What LLaMA-Factory logs after a resume: tokens counted from the start of the parent, and a
    throughput and time left from the resumed process's own seconds."""
    return [
        json.dumps(
            {
                "current_steps": s,
                "total_steps": total,
                "loss": 2.0,
                "total_tokens": s * tokens_per_step,
                "throughput": 13830.0,
                "remaining_time": "0:00:07",
            }
        )
        for s in range(first_step, first_step + n)
    ]


def test_tokens_per_second_and_eta_come_from_the_jobs_own_steps(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    parent, child, clone = new_job(engine), new_job(engine), new_job(engine)
    with engine.begin() as c:
        c.execute(
            text("UPDATE jobs SET parent_id = :p, train_yaml = :y WHERE id = :c"),
            {
                "p": parent,
                "c": child,
                "y": "stage: sft\nresume_from_checkpoint: /runs/1/output/checkpoint-100\n",
            },
        )
        c.execute(text("UPDATE jobs SET parent_id = :p WHERE id = :c"), {"p": parent, "c": clone})
    raws = resumed_lines(101, 5, tokens_per_step=200, total=300)
    t0 = 1000.0
    with engine.begin() as c:  # the first line alone: no span to measure, and LF's figures are wrong
        apply_batch(c, child, {"seq": 0, "metrics": [{"line": 0, "t": t0, "raw": raws[0]}]})
    with engine.begin() as c:  # one step every 2 s
        batch = [{"line": i, "t": t0 + 2.0 * i, "raw": raws[i]} for i in range(1, 5)]
        apply_batch(c, child, {"seq": 1, "metrics": batch})
    with Session(engine) as s:
        points = s.exec(
            select(MetricPoint).where(MetricPoint.job_id == child).order_by(MetricPoint.line)
        ).all()
        job = s.get(Job, child)
    assert [p[0].throughput for p in points] == [None, 100.0, 100.0, 100.0, 100.0]  # 200 tokens / 2 s
    assert job.current_steps == 105 and job.eta_seconds == (300 - 105) * 2.0  # not LF's 7 s

    # A job that starts afresh (a clone too): LF's figure stands until there is a span to measure.
    for own in (new_job(engine), clone):
        with engine.begin() as c:
            apply_batch(
                c, own, {"seq": 0, "metrics": [{"line": 0, "t": t0, "raw": line(1, throughput=55.5)}]}
            )
        with Session(engine) as s:
            assert s.exec(select(MetricPoint.throughput).where(MetricPoint.job_id == own)).one() == (55.5,)
            assert s.get(Job, own).eta_seconds == 65.0


def test_grad_norm_and_other_numbers_come_from_the_extra_line(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    job_id = new_job(engine)
    extra = json.dumps({"grad_norm": 0.75, "eval_runtime": 1.5, "step": 1, "name": "not a number"})
    metrics = [
        {"line": 0, "t": 1.0, "raw": line(1, loss=2.0), "extra": extra},
        {"line": 1, "t": 2.0, "raw": line(2, loss=1.9), "extra": extra},  # another step's: not used
        {"line": 2, "t": 3.0, "raw": line(3, loss=1.8), "extra": "{not json"},
    ]
    with engine.begin() as c:
        apply_batch(c, job_id, {"seq": 0, "metrics": metrics})
    with Session(engine) as s:
        rows = s.exec(
            select(MetricPoint).where(MetricPoint.job_id == job_id).order_by(MetricPoint.line)
        ).all()
    got = [MetricOut.model_validate(r[0], from_attributes=True) for r in rows]
    assert [(p.grad_norm, p.extra) for p in got] == [
        (0.75, {"eval_runtime": 1.5}),
        (None, None),
        (None, None),
    ]
    charted = metric_series(engine, job_id=job_id, max_points=10)["series"]
    assert charted["grad_norm"]["y"] == [0.75]


def test_samples_of_two_nodes_are_stored_under_their_node(tmp_path):
    # The same device index, sample numbers and times on two nodes: two series, each under its node.
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    job_id = new_job(engine)
    mem = {"line": [0, 1], "t": [5.0, 6.0], "gpu": [0, 0], "used_bytes": [10, 20], "total_bytes": [99, 99]}
    with engine.begin() as conn:
        for node in ("node-a", "node-b"):
            apply_batch(conn, job_id, {"seq": 0, "node": node, "memory": mem})
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT node, gpu, line FROM memory_samples ORDER BY node, line")).all()
    assert [tuple(r) for r in rows] == [
        ("node-a", 0, 0),
        ("node-a", 0, 1),
        ("node-b", 0, 0),
        ("node-b", 0, 1),
    ]


def test_a_batch_moves_only_its_own_job(tmp_path):
    # Progress and the trainer's pid land on the batch's job, never on a job beside it.
    from tunedeck.services.ingest.writer import memory_columns

    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    a, b, c = new_job(engine), new_job(engine), new_job(engine)
    with engine.begin() as conn:
        apply_batch(
            conn,
            b,
            {
                "seq": 0,
                "metrics": [{"line": 0, "t": 1.0, "raw": line(4, loss=1.0)}],
                "states": [{"event": "started", "trainer_pid": 4242}],
            },
        )
    with Session(engine) as s:
        got = {j: (s.get(Job, j).current_steps, s.get(Job, j).trainer_pid) for j in (a, b, c)}
    assert got == {a: (None, None), b: (4, 4242), c: (None, None)}
    with Session(engine) as s:  # the batch's number too: the replay guard of one job only
        assert [s.get(Job, j).last_batch_seq for j in (a, c)] == [-1, -1]
    # Only the sample columns the table has, and only those the batch gave.
    assert memory_columns({"line": [0], "t": [1.0], "util": None, "bogus": [1]}) == {"line": [0], "t": [1.0]}


def test_a_jobs_phase_is_the_newest_reported_and_outlives_its_end(tmp_path):
    """Phase states (runner/phases.py) set the job's phase and since when; a batch replayed late does not
    move it back; the exit keeps the last one; the REST answer and the job stream carry both."""
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    job_id = new_job(engine)
    T = 1_900_000_000.0

    def phase(seq: int, name: str, t: float, *more: dict) -> dict:
        return {"seq": seq, "states": [{"event": "phase", "phase": name, "t": t}, *more]}

    writer = IngestWriter(engine)
    writer.start()
    writer.submit(job_id, phase(0, "loading_model", T)).result(timeout=DEADLINE)
    writer.submit(job_id, phase(1, "building_op", T + 300)).result(timeout=DEADLINE)
    writer.submit(job_id, phase(0, "loading_model", T)).result(timeout=DEADLINE)  # a late replay
    with Session(engine) as s:
        job = s.get(Job, job_id)
        out = JobOut.of(job).model_dump(mode="json")
    began = datetime.fromtimestamp(T + 300, timezone.utc).isoformat()[:19]
    assert (out["phase"], out["phase_at"][:19]) == ("building_op", began), out
    events, _, _ = job_events(engine, job_id, Cursor(), limit=100)
    (row,) = [e.data for e in events if e.event == "job"]
    assert row["phase"] == "building_op" and row["phase_at"] == out["phase_at"]
    exited = {"event": "exited", "exit_code": 1, "cancelled": False, "cause": "boom"}
    writer.submit(job_id, phase(2, "training", T + 400, exited)).result(timeout=DEADLINE)
    writer.stop()
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert job.status == JobStatus.failed and job.phase == "training"  # where it was when it ended

    for state, where in (
        ({"event": "phase", "phase": "napping", "t": T}, ("states", 0, "phase")),
        ({"event": "phase", "phase": "training"}, ("states", 0)),
        ({"event": "phase", "phase": "training", "t": float("inf")}, ("states", 0, "t")),
    ):
        with pytest.raises(ValidationError) as e:
            TelemetryBatch.model_validate({"seq": 0, "states": [state]})
        assert e.value.errors()[0]["loc"] == where, e.value.errors()


def test_a_batch_as_the_wire_brings_it_moves_its_job(tmp_path):
    """A batch decoded from the JSON a runner sends (its strings are not the code's own constants):
    the trainer's pid, its phase, memory rows with an optional column the runner filled, and an exit
    on a SIGTERM that no cancel of tunedeck's sent: a failure that names the outside stop and its cause."""
    from tunedeck.services.ingest.writer import OUTSIDE_STOP, plain

    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    job_id, beside = new_job(engine), new_job(engine)
    wire = {
        "seq": 3,
        "memory": [
            {
                "line": i,
                "t": 10.0 + i,
                "gpu": 0,
                "used_bytes": 2**30 + i,
                "total_bytes": 2**34,
                "power_w": 250.0,
            }
            for i in range(3)
        ],
        "states": [
            {"event": "started", "trainer_pid": 777},
            {"event": "phase", "phase": "training", "t": 1_900_000_000.0},
            {"event": "exited", "exit_code": 143, "cancelled": True, "cause": "SIGTERM"},
        ],
    }
    batch = plain(TelemetryBatch.model_validate_json(json.dumps(wire)))
    writer = IngestWriter(engine)  # job states move inside the writer's own transaction
    writer.start()
    writer.submit(job_id, batch).result(timeout=DEADLINE)
    writer.stop()
    with Session(engine) as s:
        job = s.get(Job, job_id)
        assert (job.trainer_pid, job.phase, job.status) == (777, "training", JobStatus.failed)
        assert job.error == f"{OUTSIDE_STOP} (SIGTERM)" and job.exit_code == 143
        assert s.get(Job, beside).status == JobStatus.running
    with engine.connect() as conn:
        power = conn.execute(text("SELECT power_w FROM memory_samples ORDER BY line")).scalars().all()
    assert power == [250.0, 250.0, 250.0]
