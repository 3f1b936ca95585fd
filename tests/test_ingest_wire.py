"""Packed batches (tunedeck.contract.wire, what runners send): every value stored exactly as JSON stores it,
resends once, chart tiles equal to brute force over the stored rows, bad packings refused by field."""

from __future__ import annotations

import json
import math
import struct
from collections import defaultdict

import pytest
from sqlalchemy import text

from tests.test_ingest_columns import COLUMNS, HEADERS, columns, new_job, samples, stored
from tests.utils.refusal import refused_at
from tunedeck.contract import wire
from tunedeck.contract.protocol import TelemetryBatch
from tunedeck.runner import report
from tunedeck.services.charts import pyramid

PACKED = {**HEADERS, "Content-Type": wire.MEDIA_TYPE}


def post(app, job_id: int, body: bytes | dict, headers: dict = PACKED):
    content = body if isinstance(body, bytes) else json.dumps(body)
    return app.api.post(f"/api/jobs/{job_id}/telemetry", content=content, headers=headers)


def packed(seq: int, rows: list[dict], **more) -> bytes:
    return wire.encode({"seq": seq, "memory": report.columns(rows), **more})


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    from tests.utils.app import App

    a = App(tmp_path_factory.mktemp("wire") / "ws", assets).start()
    yield a
    a.stop()


def tiles(engine, job_id: int) -> dict[tuple, tuple]:
    with engine.begin() as c:  # every level whole: each series' open finest tile folded up first
        pyramid.settle(c.connection.cursor(), [job_id])
    with engine.connect() as c:
        rows = c.execute(
            text(
                f"SELECT series, level, tile, {', '.join(pyramid.FIELDS)} FROM chart_tiles WHERE job_id = :j"
            ),
            {"j": job_id},
        ).all()
    return {(s, lv, t): tuple(rest) for s, lv, t, *rest in rows}


def brute_tiles(engine, job_id: int) -> dict[tuple, tuple]:
    """Every memory tile of every level from the stored rows: n, then min / max by (y, x), first /
    last by (x, y), each as (x, y, row id)."""
    with engine.connect() as c:
        rows = c.execute(
            text("SELECT node, gpu, t, used_bytes, id FROM memory_samples WHERE job_id = :j"), {"j": job_id}
        ).all()
    out = {}
    for level in range(pyramid.FINEST, pyramid.LEVELS + 1):
        groups = defaultdict(list)
        for node, gpu, t, used, rid in rows:
            groups[(pyramid.memory_key(node, gpu), level, math.floor(t / 4**level))].append((t, used, rid))
        for key, pts in groups.items():
            lo = min(pts, key=lambda p: (p[1], p[0]))
            hi = max(pts, key=lambda p: (p[1], p[0]))
            first = min(pts, key=lambda p: (p[0], p[1]))
            last = max(pts, key=lambda p: (p[0], p[1]))
            out[key] = (len(pts), *lo, *hi, *first, *last)
    return out


def test_packed_stores_every_value_as_json_does(app, assets):
    by_json, by_packed = new_job(app, assets, "json"), new_job(app, assets, "packed")
    rows = samples(0, 3000)
    rows[7]["total_bytes"] = None  # a reading one sample lacks, in each optional column
    rows[8]["power_w"] = 0.1 + 0.2  # a float with no short decimal form, stored to the last bit
    # Overlapping batches, as a runner resends after a lost answer: each sample is stored once.
    for seq, (a, b) in enumerate(((0, 2000), (1500, 3000), (0, 3000), (2999, 3000))):
        r = post(app, by_json, {"seq": seq, "memory": columns(rows[a:b])}, HEADERS)
        assert r.status_code == 200, r.text
        r = post(app, by_packed, packed(seq, rows[a:b]))
        assert r.status_code == 200, r.text
        assert r.json() == {"stored": seq}
    want = [tuple(r[k] for k in COLUMNS) for r in rows]
    assert stored(app.engine, by_json) == want
    assert stored(app.engine, by_packed) == want
    assert stored(app.engine, by_packed)[8][6] == 0.1 + 0.2
    # The chart tiles, kept per batch as they came, hold what the stored rows give (the readings'
    # tiles beside them: tests/telemetry/test_readings.py).
    memory = lambda t: {k: v for k, v in t.items() if k[0].startswith("memory.")}  # noqa: E731
    assert memory(tiles(app.engine, by_packed)) == memory(brute_tiles(app.engine, by_packed))


def test_packed_batch_carries_its_other_items(app, assets):
    job_id = new_job(app, assets, "lines")
    line = {"current_steps": 3, "total_steps": 10, "loss": 1.5}
    body = packed(
        0,
        samples(0, 4),
        metrics=[{"line": 0, "t": 1.0, "raw": json.dumps(line)}],
        logs=[{"line": 0, "t": 1.0, "stream": "stdout", "text": "hello"}],
    )
    assert post(app, job_id, body).status_code == 200
    with app.engine.connect() as c:
        assert c.execute(
            text("SELECT step, loss FROM metric_points WHERE job_id = :j"), {"j": job_id}
        ).all() == [(3, 1.5)]
        assert c.execute(text("SELECT text FROM log_lines WHERE job_id = :j"), {"j": job_id}).all() == [
            ("hello",)
        ]
    assert len(stored(app.engine, job_id)) == 4
    # Optional columns left out altogether; a batch with no memory at all.
    required = {k: v for k, v in columns(samples(4, 3)).items() if k in wire.REQUIRED}
    assert post(app, job_id, wire.encode({"seq": 1, "memory": required})).status_code == 200
    assert stored(app.engine, job_id)[-1][4:] == (None,) * 5
    assert post(app, job_id, wire.encode({"seq": 2, "logs": []})).status_code == 200


def header(desc: dict, cols: bytes = b"", **head) -> bytes:
    h = json.dumps({"seq": 0, **head, "memory": desc}).encode()
    return wire.MAGIC + struct.pack("<I", len(h)) + h + cols


def pack(n: int, **cols: list) -> tuple[dict, bytes]:
    return {"n": n, "columns": list(cols)}, b"".join(
        struct.pack(f"<{n}{wire.PACKED[k]}", *v) for k, v in cols.items()
    )


GOOD = {"line": [1, 2], "t": [1.0, 2.0], "gpu": [0, 1], "used_bytes": [10, 20]}


def bad(**change) -> bytes:
    desc, cols = pack(2, **{**GOOD, **change})
    return header(desc, cols)


@pytest.mark.parametrize(
    ("body", "loc", "kind"),
    [
        (bad(t=[1.0, math.nan]), ["memory", "t", 1], "finite_number"),
        (bad(util=[math.nan, math.inf]), ["memory", "util", 1], "finite_number"),
        (bad(used_bytes=[10, -1]), ["memory", "used_bytes", 1], "greater_than_equal"),
        (bad(line=[2**62 + 1, 1]), ["memory", "line", 0], "less_than_equal"),
        (bad(gpu=[0, -2]), ["memory", "gpu", 1], "greater_than_equal"),
        (bad(total_bytes=[-1, -2]), ["memory", "total_bytes", 1], "greater_than_equal"),
        (header(*pack(2, **{k: v for k, v in GOOD.items() if k != "gpu"})), ["memory", "gpu"], "missing"),
        (bad()[:-1], ["memory"], "packed_length"),
        (bad() + b"\0" * 8, ["memory"], "packed_length"),
        (header({"n": 2, "columns": [*GOOD, "vram"]}), ["memory", "columns"], "packed_column"),
        (header({"n": 2, "columns": [*GOOD, "t"]}), ["memory", "columns"], "packed_column"),
        (
            header({**pack(2, **GOOD)[0], "name": ["a"]}, pack(2, **GOOD)[1]),
            ["memory", "name"],
            "column_length",
        ),
        (header({"n": 20001, "columns": list(GOOD)}), ["memory", "n"], "less_than_equal"),
        (header({"n": 2, "columns": list(GOOD), "rows": 1}), ["memory", "rows"], "extra_forbidden"),
        (header(*pack(2, **GOOD), seq=-1), ["seq"], "greater_than_equal"),
        (header(*pack(2, **GOOD), logs=[{"line": 0}]), ["logs", 0, "t"], "missing"),
        (b"TDB2" + bad()[4:], [], "packed_magic"),
        (wire.MAGIC + struct.pack("<I", 3) + b"{no", [], "packed_header"),
        (wire.MAGIC + struct.pack("<I", 2) + b"[]", [], "packed_header"),
    ],
)
def test_bad_packings_are_refused_by_field(app, assets, body, loc, kind):
    job_id = new_job(app, assets, f"bad-{kind}")
    r = post(app, job_id, body)
    refused_at(r, ["body", *loc], kind)
    assert stored(app.engine, job_id) == []


def test_an_unknown_body_type_is_refused(app, assets):
    job_id = new_job(app, assets, "plain")
    r = post(app, job_id, b'{"seq": 0}', {**HEADERS, "Content-Type": "text/plain"})
    assert r.status_code == 422
    assert r.json()["detail"][0]["loc"] == ["header", "content-type"]
    r = post(app, job_id, b'{"seq": 0', HEADERS)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"


def test_the_runner_packs_what_packs_and_sends_json_otherwise():
    batch = {"seq": 4, "metrics": [], "logs": [], "states": [], "memory": report.columns(samples(0, 500))}
    content, kind = report.body(batch)
    assert kind == wire.MEDIA_TYPE and len(content) < len(json.dumps(batch))
    head, cols = wire.decode(content)
    assert head.seq == 4 and cols == batch["memory"]
    batch["memory"]["gpu"][0] = 2**40  # out of the packed column's range: JSON says it as it is
    content, kind = report.body(batch)
    assert kind == "application/json" and json.loads(content) == batch


def test_a_server_from_before_packed_batches_is_told_apart_from_a_bad_batch(app, assets):
    """Such a server took a JSON TelemetryBatch and nothing else: the runner then sends JSON."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from tunedeck.api import errors

    old = FastAPI()
    errors.install(old, app.settings)  # tunedeck's answers to bad input, as then

    @old.post("/api/jobs/{job_id}/telemetry")
    def ingest(job_id: int, batch: TelemetryBatch) -> dict:
        return {"stored": batch.seq}

    content, kind = report.body({"seq": 0, "memory": report.columns(samples(0, 3))})
    with TestClient(old) as client:
        r = client.post("/api/jobs/1/telemetry", content=content, headers={"Content-Type": kind})
    assert r.status_code == 422 and report.unpacked(r), r.text
    job_id = new_job(app, assets, "refused")
    assert not report.unpacked(post(app, job_id, bad(t=[1.0, math.inf])))
    assert post(app, job_id, content).status_code == 200
