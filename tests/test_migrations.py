"""Alembic owns the schema, in one line of history that matches the models, and every step keeps data."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text
from sqlmodel import SQLModel

import tunedeck.store.tables  # noqa: F401  (the tables compared against)
from tunedeck.store.db import MIGRATIONS_DIR, downgrade, make_engine, upgrade
from tunedeck.store.legacy_heads import LINE, LegacyHeadsError

GiB = 1 << 30

# A few rows in every table; byte counts past 2**31 on purpose. Parents come first (foreign keys).
ROWS: dict[str, list[dict]] = {
    "jobs": [
        {
            "id": j,
            "name": f"job{j}",
            "owner": "ana",
            "status": "succeeded",
            "gpus": 1,
            "spec": '{"a": 1}',
            "train_yaml": "a: 1",
            "run_dir": f"/r/{j}",
            "output_dir": f"/o/{j}",
            "created_at": "2026-01-01 00:00:00",
            "last_batch_seq": 3,
            "estimate": '{"peak_bytes": 1}',
            # The team row's summary (0021), as that step fills it from the rows below: no chart
            # tiles (no peak), the newest sample's device size, the newest line's loss.
            "total_vram_bytes": 141 * GiB,
            "last_loss": 3.0,
            "last_loss_line": 2,
        }
        for j in (1, 2)
    ],
    "metric_points": [
        {
            "id": 10 * j + i,
            "job_id": j,
            "line": i,
            "t": 1.5 + i,
            "step": i,
            "loss": 5.0 - i,
            "raw": f'{{"current_steps": {i}}}',
        }
        for j in (1, 2)
        for i in range(3)
    ],
    "log_lines": [
        {"id": 10 * j + i, "job_id": j, "line": i, "t": 2.0 + i, "stream": "stdout", "text": f"line {i}"}
        for j in (1, 2)
        for i in range(3)
    ],
    "api_tokens": [
        {
            "id": 1,
            "name": "ci",
            "role": "submitter",
            "token_hash": "ab" * 32,
            "created_at": "2026-01-01 00:00:00",
        }
    ],
    "estimate_calibrations": [
        {
            "id": 1,
            "job_id": 1,
            "gpu_kind": "H200",
            "predicted_bytes": 100 * GiB,
            "measured_bytes": 120 * GiB,
            "source": "memory_samples",
            "ratio": 1.2,
            "created_at": "2026-01-02 00:00:00",
        }
    ],
    "memory_samples": [
        {
            "id": 10 * j + i,
            "job_id": j,
            "line": i,
            "t": 3.0 + i,
            "gpu": 0,
            "used_bytes": 130 * GiB + i,
            "total_bytes": 141 * GiB,
            "util": 90.0,
            "name": "H200",
        }
        for j in (1, 2)
        for i in range(3)
    ],
    "alerts": [
        {
            "id": 1,
            "job_id": 2,
            "kind": "near_oom",
            "severity": "warning",
            "gpu": 0,
            "t": 4.0,
            "step": 2,
            "message": "95% of VRAM",
            "open": 1,
            "first_t": 3.0,
            "last_t": 4.0,
            "count": 2,
        }
    ],
    "team_presets": [
        {
            "id": 1,
            "name": "team-sft",
            "owner": "ana",
            "description": "our LoRA SFT",
            "text": "stage: sft\n",
            "created_at": "2026-01-03 00:00:00",
        }
    ],
    "memory_rollups": [
        {
            "id": 1,
            "job_id": 1,
            "gpu": 0,
            "t0": 0.0,
            "t1": 60.0,
            "n": 12,
            "min_bytes": 3 * GiB,
            "max_bytes": 130 * GiB,
            "mean_bytes": 99.5 * GiB,
        }
    ],
}

# Tables a step up drops with their rows, on purpose: memory_rollups (0014), read by nothing since the
# chart tiles (0013). Older revisions still have them, and ROWS fills them there.
RETIRED = {"memory_rollups"}

# The branched history that older tunedeck releases shipped (from git), and the heads each left behind.
OLD_PARENTS = {
    "0001": None,
    "0002": "0001",
    "0003": "0001",
    "0004_ui": "0001",
    "0005": "0001",
    "0006": "0002",
}
OLD_ENV = """from alembic import context
connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
"""


def fill(engine) -> None:
    """Insert ROWS into the tables the database has, in the columns it has."""
    present = inspect(engine)
    with engine.begin() as c:
        for table, rows in ROWS.items():
            if not present.has_table(table):
                continue
            cols = {col["name"] for col in present.get_columns(table)}
            for row in rows:
                row = {k: v for k, v in row.items() if k in cols}
                c.execute(
                    text(
                        f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(':' + k for k in row)})"
                    ),
                    row,
                )


def insert(engine, table: str) -> None:
    with engine.begin() as c:
        for row in ROWS[table]:
            c.execute(
                text(f"INSERT INTO {table} ({', '.join(row)}) VALUES ({', '.join(':' + k for k in row)})"),
                row,
            )


def snapshot(engine) -> dict[str, list[dict]]:
    present = set(inspect(engine).get_table_names())
    with engine.connect() as c:
        return {
            t: [dict(r._mapping) for r in c.execute(text(f"SELECT * FROM {t} ORDER BY id"))]
            for t in ROWS
            if t in present
        }


def assert_kept(before: dict, after: dict, *, dropped: set[str] = frozenset()) -> None:
    """Every table of `before` that was not dropped holds the same rows, on the columns both sides have."""
    assert set(before) - dropped <= set(after)
    for table, rows in before.items():
        if table in dropped:
            continue
        assert rows, f"{table} was filled"
        assert len(after[table]) == len(rows), table
        cols = rows[0].keys() & after[table][0].keys()
        assert [{k: r[k] for k in cols} for r in after[table]] == [{k: r[k] for k in cols} for r in rows], (
            table
        )


def assert_sound(engine) -> None:
    with engine.connect() as c:
        assert c.execute(text("PRAGMA integrity_check")).scalar() == "ok"
        assert c.execute(text("PRAGMA foreign_key_check")).all() == []


def schema_differences(engine) -> list:
    with engine.connect() as c:
        ctx = MigrationContext.configure(c, opts={"compare_type": True, "compare_server_default": True})
        return compare_metadata(ctx, SQLModel.metadata)


def versions(engine) -> set[str]:
    with engine.connect() as c:
        return {r[0] for r in c.execute(text("SELECT version_num FROM alembic_version"))}


def legacy_database(tmp_path: Path, targets: tuple[str, ...]):
    """A database made the old way: today's migration bodies on the old branched parents, old env.py."""
    tree = tmp_path / "legacy"
    (tree / "versions").mkdir(parents=True)
    shutil.copy(MIGRATIONS_DIR / "script.py.mako", tree)
    (tree / "env.py").write_text(OLD_ENV)
    for f in (MIGRATIONS_DIR / "versions").glob("*.py"):
        src = f.read_text()
        rev = re.search(r'^revision = "(.+)"$', src, re.MULTILINE).group(1)
        if rev not in OLD_PARENTS:  # added after the history became one line: no old release had it
            continue
        parent = OLD_PARENTS[rev]
        src = re.sub(r"^down_revision = .+$", f"down_revision = {parent!r}", src, flags=re.MULTILINE)
        (tree / "versions" / f.name).write_text(src)
    engine = make_engine(tmp_path / "old.db")
    cfg = Config()
    cfg.set_main_option("script_location", str(tree))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        for target in targets:  # in the order the releases added them
            command.upgrade(cfg, target)
    return engine


def test_history_is_one_line():
    script = ScriptDirectory(str(MIGRATIONS_DIR))
    assert len(script.get_heads()) == 1
    assert len(script.get_bases()) == 1
    line = [r.revision for r in reversed(list(script.walk_revisions()))]
    assert line[: len(LINE)] == list(LINE)  # the old revisions keep their place; new ones follow


def test_schema_matches_models(tmp_path):
    engine = make_engine(tmp_path / "m.db")
    upgrade(engine)
    assert versions(engine) == {ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()}
    assert schema_differences(engine) == []


def test_every_step_down_and_up_keeps_data(tmp_path):
    engine = make_engine(tmp_path / "m.db")
    upgrade(engine)
    fill(engine)
    full = snapshot(engine)
    assert set(full) == set(ROWS) - RETIRED
    assert not RETIRED & set(inspect(engine).get_table_names())

    downgrade(engine, "-1")  # on a database with data, one step down and up again
    dropped = set(full) - set(snapshot(engine))
    assert_kept(full, snapshot(engine), dropped=dropped)
    upgrade(engine)
    assert_kept(full, snapshot(engine), dropped=dropped)
    assert_sound(engine)

    for table in dropped:  # what that step dropped is refilled, so every step down starts with data
        insert(engine, table)
    before = snapshot(engine)
    assert set(before) == set(ROWS) - RETIRED and all(before.values())

    steps = 0
    while versions(engine):
        downgrade(engine, "-1")
        steps += 1
        now = snapshot(engine)
        assert_kept(before, now, dropped=set(before) - set(now))
        assert_sound(engine)
        for table in RETIRED & {t for t, rows in now.items() if not rows}:  # made again by the step, empty
            insert(engine, table)
            before[table] = snapshot(engine)[table]
    assert steps >= len(LINE)
    assert set(inspect(engine).get_table_names()) == {"alembic_version"}

    upgrade(engine, "+1")
    fill(engine)
    before = snapshot(engine)
    head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
    while versions(engine) != {head}:
        upgrade(engine, "+1")
        assert_kept(before, snapshot(engine))
        assert_sound(engine)
    assert schema_differences(engine) == []


@pytest.mark.parametrize(
    "targets",
    [
        ("0001",),
        ("0005",),
        ("0005", "0003"),
        ("0005", "0003", "0002", "0004_ui"),
        ("0005", "0003", "0002", "0004_ui", "0006"),
    ],
    ids=lambda t: "+".join(t),
)
def test_databases_from_the_branched_history_upgrade_in_place(tmp_path, targets):
    engine = legacy_database(tmp_path, targets)
    old_heads = versions(engine)
    if len(targets) >= 2:
        assert len(old_heads) >= 2  # the case this exists for: several rows in alembic_version
    fill(engine)
    before = snapshot(engine)

    upgrade(engine)

    assert versions(engine) == {ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()}
    assert_kept(before, snapshot(engine), dropped=RETIRED)
    assert schema_differences(engine) == []
    with engine.connect() as c:
        assert c.execute(text("SELECT job_id FROM job_changes ORDER BY job_id")).scalars().all() == [1, 2]
    assert_sound(engine)
    downgrade(engine, "base")
    upgrade(engine)
    assert schema_differences(engine) == []


def test_heads_no_release_left_are_refused_unchanged(tmp_path):
    engine = legacy_database(tmp_path, ("0005", "0002"))  # 0003 never applied, yet it comes before 0002
    with pytest.raises(LegacyHeadsError, match="0003"):
        upgrade(engine)
    assert versions(engine) == {"0005", "0002"}


def test_upgrade_and_downgrade_keep_data(tmp_path):
    engine = make_engine(tmp_path / "m.db")
    upgrade(engine, "0001")
    with engine.begin() as c:
        for j in (1, 2):
            c.execute(
                text(
                    "INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at,"
                    " last_batch_seq) VALUES (:id, :n, 'succeeded', 0, '{}', 'a: 1', '', '', '2026-01-01', 3)"
                ),
                {"id": j, "n": f"job{j}"},
            )
            for i in range(50):
                c.execute(
                    text(
                        "INSERT INTO metric_points (job_id, line, t, loss, raw) VALUES (:j, :i, :i, :l, :r)"
                    ),
                    {"j": j, "i": i, "l": 5.0 - i / 10, "r": f'{{"current_steps": {i}}}'},
                )
                c.execute(
                    text(
                        "INSERT INTO log_lines (job_id, line, t, stream, text) VALUES (:j, :i, :i, 'stdout', 'x')"
                    ),
                    {"j": j, "i": i},
                )
    before = snapshot(engine)
    upgrade(engine)
    tables = set(inspect(engine).get_table_names())
    assert {"api_tokens", "jobs", "metric_points", "log_lines"} <= tables
    assert_kept(before, snapshot(engine))
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO api_tokens (name, role, token_hash, created_at) VALUES ('a', 'admin', 'h', '2026-01-01')"
            )
        )
    downgrade(engine, "0001")
    assert "api_tokens" not in set(inspect(engine).get_table_names())
    assert snapshot(engine) == before
    upgrade(engine)
    assert_kept(before, snapshot(engine))
    assert_sound(engine)
