"""Memory samples as columns (what runners send): stored exactly as the row form, validated by field."""

from __future__ import annotations

import json
import math

import pytest
from sqlalchemy import text
from sqlmodel import Session

from tests.utils.factories import create_job
from tests.utils.refusal import refused_at
from tests.utils.servers import demo_config
from tests.utils.wait import DEADLINE
from tunedeck.services.ingest.writer import IngestWriter
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Job, JobStatus

TOKEN = "runner-secret"
HEADERS = {"Authorization": f"Bearer {TOKEN}", "X-Tunedeck": "1", "Content-Type": "application/json"}
COLUMNS = ("line", "t", "gpu", "used_bytes", "total_bytes", "util", "power_w", "temp_c", "name")


def samples(first: int, n: int) -> list[dict]:
    """Rows as a sampler makes them: some optional readings missing, some GPUs without a name."""
    return [
        {
            "line": i,
            "t": 1_800_000_000.0 + i / 4,
            "gpu": i % 4,
            "used_bytes": 40 * 2**30 + i * 4099,
            "total_bytes": 192 * 2**30,
            "util": None if i % 3 == 0 else i % 100 / 1.0,
            "power_w": 300.5 + i,
            "temp_c": None,
            "name": "MI300X" if i % 4 else None,
        }
        for i in range(first, first + n)
    ]


def columns(rows: list[dict]) -> dict:
    return {k: [r[k] for r in rows] for k in COLUMNS}


def stored(engine, job_id: int) -> list[tuple]:
    with engine.connect() as c:
        return [
            tuple(r)
            for r in c.execute(
                text(f"SELECT {', '.join(COLUMNS)} FROM memory_samples WHERE job_id = :j ORDER BY line"),
                {"j": job_id},
            )
        ]


def post(app, job_id: int, body: dict | str):
    content = body if isinstance(body, str) else json.dumps(body)
    return app.api.post(f"/api/jobs/{job_id}/telemetry", content=content, headers=HEADERS)


@pytest.fixture
def app(app_factory):
    return app_factory()


def new_job(app, assets, name: str) -> int:
    """A running job on the four GPUs its samples name."""
    made = create_job(
        app.engine,
        app.settings,
        config=demo_config(assets),
        name=name,
        runner_token=TOKEN,
        gpus=4,
        node_gpus=4,
    )
    return made.id


def test_columns_store_what_rows_store(app, assets):
    by_rows, by_columns = new_job(app, assets, "rows"), new_job(app, assets, "columns")
    rows = samples(0, 300)
    # Overlapping batches, as a runner resends after a lost answer: each sample is stored once.
    for seq, (a, b) in enumerate(((0, 200), (150, 300), (0, 300))):
        assert post(app, by_rows, {"seq": seq, "memory": rows[a:b]}).status_code == 200
        r = post(app, by_columns, {"seq": seq, "memory": columns(rows[a:b])})
        assert r.status_code == 200, r.text
        assert r.json() == {"stored": seq}
    want = [tuple(r[k] for k in COLUMNS) for r in rows]
    assert stored(app.engine, by_rows) == want
    assert stored(app.engine, by_columns) == want
    # Optional columns may be left out altogether.
    required = {k: v for k, v in columns(samples(300, 5)).items() if k in ("line", "t", "gpu", "used_bytes")}
    assert post(app, by_columns, {"seq": 3, "memory": required}).status_code == 200
    assert stored(app.engine, by_columns)[-5:] == [
        (r["line"], r["t"], r["gpu"], r["used_bytes"], *[None] * 5) for r in samples(300, 5)
    ]


NAN_T = '{"seq": 0, "memory": {"line": [1, 2], "t": [1.0, NaN], "gpu": [0, 0], "used_bytes": [1, 2]}}'
INF_UTIL = (
    '{"seq": 0, "memory": {"line": [1, 2, 3], "t": [1, 2, 3], "gpu": [0, 0, 0], "used_bytes": [1, 2, 3],'
    ' "util": [null, 1.5, Infinity]}}'
)
ROW_NAN = '{"seq": 0, "memory": [{"line": 9, "t": 1.0, "gpu": -1, "used_bytes": 1, "util": NaN}]}'
GOOD = {"line": [1, 2], "t": [1.0, 2.0], "gpu": [0, 1], "used_bytes": [10, 20]}


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        (NAN_T, ["memory", "t", 1], "finite_number"),
        (INF_UTIL, ["memory", "util", 2], "finite_number"),
        (ROW_NAN, ["memory", 0, "util"], "finite_number"),  # the row form keeps its locations
        (
            {"seq": 0, "memory": {**GOOD, "used_bytes": [10, -1]}},
            ["memory", "used_bytes", 1],
            "greater_than_equal",
        ),
        ({"seq": 0, "memory": {**GOOD, "line": [1, 2**63]}}, ["memory", "line", 1], "less_than_equal"),
        ({"seq": 0, "memory": {**GOOD, "gpu": [0]}}, ["memory", "gpu"], "column_length"),
        ({"seq": 0, "memory": {**GOOD, "name": ["a", "b", "c"]}}, ["memory", "name"], "column_length"),
        (
            {"seq": 0, "memory": {k: v for k, v in GOOD.items() if k != "used_bytes"}},
            ["memory", "used_bytes"],
            "missing",
        ),
        ({"seq": 0, "memory": {**GOOD, "vram": [1, 2]}}, ["memory", "vram"], "extra_forbidden"),
        ({"seq": 0, "memory": {**GOOD, "gpu": "0,1"}}, ["memory", "gpu"], "list_type"),
        (
            {"seq": 0, "memory": {**GOOD, "t": list(range(20001)), "line": list(range(20001))}},
            ["memory", "line"],
            "too_long",
        ),
    ],
)
def test_bad_columns_are_refused_by_field(app, assets, body, loc, kind):
    job_id = new_job(app, assets, "bad")
    r = post(app, job_id, body)
    refused_at(r, ["body", *loc], kind)
    assert stored(app.engine, job_id) == []


def test_a_replayed_outbox_of_columns_is_stored_once(tmp_path):
    """The scheduler replays a dead runner's outbox straight into the writer, columns and all."""
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    with Session(engine) as s:
        job = Job(name="j", spec="{}", train_yaml="", status=JobStatus.running)
        s.add(job)
        s.commit()
        job_id = job.id
    rows = samples(0, 50)
    batches = [{"seq": 0, "memory": columns(rows[:30])}, {"seq": 1, "memory": columns(rows[20:])}]
    writer = IngestWriter(engine)
    writer.start()
    try:
        for b in batches + batches:
            writer.submit(job_id, b).result(timeout=DEADLINE)
    finally:
        writer.stop()
    assert stored(engine, job_id) == [tuple(r[k] for k in COLUMNS) for r in rows]
    assert writer.items == 2 * (30 + 30)  # samples handled, not columns
    assert all(isinstance(v, float) and math.isfinite(v) for (_, v, *_) in stored(engine, job_id))
