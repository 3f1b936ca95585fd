"""The ingest path on a real SQLite file: idempotent batches, progress, final states."""

from __future__ import annotations

import json

from sqlalchemy import Integer, func, select, text
from sqlmodel import Session

from tunedeck.db import downgrade, make_engine, upgrade
from tunedeck.lflog import COUNTS, METRICS, parse_point, seconds
from tunedeck.schemas import MetricOut
from tunedeck.services.feed import Cursor, job_events
from tunedeck.services.ingest import IngestWriter, apply_batch
from tunedeck.services.metric_charts import metric_series
from tunedeck.tables import Job, JobStatus, LogLine, MetricPoint

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
        writer.submit(job_id, batch).result(timeout=10)
    old = {
        "seq": 1,
        "metrics": [{"line": 0, "t": 1.0, "raw": line(1, loss=5.0)}],
        "logs": [],
        "states": [{"event": "exited", "exit_code": 0, "cancelled": False, "cause": None}],
    }
    writer.submit(job_id, old).result(timeout=10)
    writer.stop()
    with Session(engine) as s:
        assert s.exec(select(func.count()).select_from(MetricPoint)).one()[0] == 3
        assert s.exec(select(func.count()).select_from(LogLine)).one()[0] == 1
        job = s.get(Job, job_id)
        assert job.current_steps == 3  # a replayed old line does not move progress back
        assert job.eta_seconds == 0.0 and job.status == JobStatus.succeeded
        assert job.last_batch_seq == 1


def test_exit_states():
    from tunedeck.services.ingest import final_status

    assert final_status(exit_code=0, cancelled=True) == JobStatus.cancelled
    assert final_status(exit_code=-9, cancelled=False) == JobStatus.failed
    assert final_status(exit_code=0, cancelled=False) == JobStatus.succeeded


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
    assert list(charted) == [k for k in METRICS if k not in ("epoch", *COUNTS)]
    assert {k: s["y"] for k, s in charted.items()} == {k: [values[k]] for k in charted}
