"""Alembic owns the schema: upgrade and downgrade on a database that holds data lose none of it."""

from __future__ import annotations

from sqlalchemy import inspect, text

from tunedeck.db import downgrade, make_engine, upgrade


def snapshot(engine) -> dict:  # noqa: ANN001
    with engine.connect() as c:
        return {
            "jobs": c.execute(text("SELECT id, name, status, spec, train_yaml FROM jobs ORDER BY id")).all(),
            "points": c.execute(text("SELECT job_id, line, loss, raw FROM metric_points ORDER BY id")).all(),
            "logs": c.execute(text("SELECT job_id, line, text FROM log_lines ORDER BY id")).all(),
        }


def test_upgrade_and_downgrade_keep_data(tmp_path):
    engine = make_engine(tmp_path / "m.db")
    upgrade(engine, "0001")
    with engine.begin() as c:
        for j in (1, 2):
            c.execute(text("INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at,"
                           " last_batch_seq) VALUES (:id, :n, 'succeeded', 0, '{}', 'a: 1', '', '', '2026-01-01', 3)"),
                      {"id": j, "n": f"job{j}"})
            for i in range(50):
                c.execute(text("INSERT INTO metric_points (job_id, line, t, loss, raw) VALUES (:j, :i, :i, :l, :r)"),
                          {"j": j, "i": i, "l": 5.0 - i / 10, "r": f'{{"current_steps": {i}}}'})
                c.execute(text("INSERT INTO log_lines (job_id, line, t, stream, text) VALUES (:j, :i, :i, 'stdout', 'x')"),
                          {"j": j, "i": i})
    before = snapshot(engine)
    upgrade(engine)  # every head
    tables = set(inspect(engine).get_table_names())
    assert {"api_tokens", "jobs", "metric_points", "log_lines"} <= tables
    assert snapshot(engine) == before
    with engine.begin() as c:
        c.execute(text("INSERT INTO api_tokens (name, role, token_hash, created_at) VALUES ('a', 'admin', 'h', '2026-01-01')"))
    downgrade(engine, "0001")
    assert "api_tokens" not in set(inspect(engine).get_table_names())
    assert snapshot(engine) == before
    upgrade(engine)
    assert snapshot(engine) == before
    with engine.connect() as c:
        assert c.execute(text("PRAGMA integrity_check")).scalar() == "ok"
