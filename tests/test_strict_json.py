"""Strict JSON out (RFC 8259): a trainer_log.jsonl that holds Infinity and NaN, as LLaMA-Factory's
json.dumps writes them for a diverged loss, reaches every REST answer and every stream as null plus
the fact (`nonfinite`), never as a bare token a browser's JSON.parse throws on."""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest
from sqlalchemy import text

from tests.sseclient import events, strict
from tests.utils.servers import demo_config, runner_token
from tests.utils.wait import until
from tunedeck.contract import strictjson
from tunedeck.contract.lflog import parse_point
from tunedeck.store.db import downgrade, make_engine, upgrade

INF, NAN = float("inf"), float("nan")


def trainer_log() -> str:
    """Five lines: two finite losses, a NaN eval loss, a NaN loss, and an Infinity loss last."""
    base = {"total_steps": 4, "lr": 1e-3, "epoch": 0.5, "remaining_time": "0:00:03"}
    lines = [
        {"current_steps": 1, "loss": 2.5, "elapsed_time": "0:00:01"},
        {"current_steps": 2, "loss": 3.5, "elapsed_time": "0:00:02"},
        {"current_steps": 2, "eval_loss": NAN, "elapsed_time": "0:00:02"},
        {"current_steps": 3, "loss": NAN, "elapsed_time": "0:00:03"},
        {"current_steps": 4, "loss": INF, "elapsed_time": "0:00:04"},
    ]
    out = "".join(json.dumps({**base, **x}) + "\n" for x in lines)
    assert "Infinity" in out and "NaN" in out  # what json.dumps writes, and what we must not pass on
    return out


def get(server, path: str, **params) -> dict | list:
    r = server.api.get(path, params=params)
    assert r.status_code == 200, r.text
    return strict(r.text)


def stream_until(server, until, **params) -> list[dict]:
    """Events of /api/stream (parsed strictly) until `until(events)` holds."""
    got: list[dict] = []
    with (
        httpx.Client(base_url=server.url, timeout=120) as client,
        client.stream("GET", "/api/stream", params=params) as r,
    ):
        assert r.status_code == 200
        for ev in events(r):
            got.append(ev)
            if until(got):
                return got
    raise AssertionError(f"stream ended early: {got}")


def rows_of(evs: list[dict], kind: str) -> list[dict]:
    return [row for ev in evs if ev["event"] == kind for row in ev["data"]]


def team_row(evs: list[dict], job_id: int) -> dict | None:
    return next((j for j in reversed(rows_of(evs, "jobs")) if j["id"] == job_id), None)


def test_infinity_and_nan_of_an_imported_run_go_out_as_null_with_the_fact(server_factory):
    server = server_factory()
    r = server.api.post(
        "/api/runs/import", files={"trainer_log": trainer_log().encode()}, data={"name": "diverged"}
    )
    assert r.status_code == 201, r.text
    job_id = strict(r.text)["id"]

    assert [j["id"] for j in get(server, "/api/jobs")["jobs"]] == [job_id]
    assert get(server, f"/api/jobs/{job_id}")["progress"]["current_steps"] == 4
    points = get(server, f"/api/jobs/{job_id}/metrics")["points"]
    assert [p["loss"] for p in points] == [2.5, 3.5, None, None, None]
    assert [p["nonfinite"] for p in points] == [
        None,
        None,
        {"eval_loss": "nan"},
        {"loss": "nan"},
        {"loss": "inf"},
    ]
    assert points[2]["eval_loss"] is None and points[4]["lr"] == 1e-3

    series = get(server, f"/api/jobs/{job_id}/series")["series"]
    assert series["loss"]["step"] == [1, 2] and series["loss"]["y"] == [2.5, 3.5]
    assert series["loss"]["nonfinite_points"]["step"] == [3, 4]
    assert series["loss"]["nonfinite_points"]["value"] == ["nan", "inf"]
    assert series["eval_loss"]["nonfinite_points"]["value"] == ["nan"] and series["eval_loss"]["y"] == []
    assert series["lr"]["nonfinite_points"]["step"] == []
    thin = get(server, f"/api/jobs/{job_id}/series", max_points=10, x0=4, x1=4)["series"]["loss"]
    assert thin["nonfinite_points"]["step"] == [4]  # a zoomed window holds only its own points

    alerts = get(server, f"/api/jobs/{job_id}/alerts")
    (nan,) = [a for a in alerts if a["kind"] == "loss_nan"]
    assert nan["message"] == "eval_loss became NaN/inf at step 2 (3 point(s))"
    get(server, "/api/alerts")
    get(server, f"/api/jobs/{job_id}/memory")

    # The team stream: every row, with the last loss as null and the fact beside it.
    evs = stream_until(server, lambda e: team_row(e, job_id) is not None)
    row = team_row(evs, job_id)
    assert row["last_loss"] is None and row["nonfinite"] == {"last_loss": "inf"}
    # The job's stream: its row, then its points with their facts.
    evs = stream_until(server, lambda e: len(rows_of(e, "metrics")) >= 5, job=job_id)
    job_rows = [ev["data"] for ev in evs if ev["event"] == "job"]
    assert job_rows and job_rows[0]["nonfinite"] == {"last_loss": "inf"}
    assert [m["nonfinite"] for m in rows_of(evs, "metrics")] == [
        None,
        None,
        {"eval_loss": "nan"},
        {"loss": "nan"},
        {"loss": "inf"},
    ]


@pytest.mark.slow
def test_a_live_run_reporting_infinity_streams_strict_json_and_alerts(server_factory, assets):
    server = server_factory()
    job = server.submit(
        {"name": "live", "config": demo_config(assets, max_steps=3000, save_steps=1000), "gpus": 0}
    )
    until(lambda: server.api.get(f"/api/jobs/{job['id']}/metrics").json()["points"], "a metric point", 240)
    # The job's own runner credentials: this test reports as the runner does.
    token = runner_token(server, job["id"])
    url = f"/api/jobs/{job['id']}/telemetry"
    auth = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    line = json.dumps(
        {
            "current_steps": 1,
            "total_steps": 3000,
            "loss": INF,
            "lr": 5e-3,
            "epoch": 0.06,
            "elapsed_time": "0:00:01",
            "remaining_time": "0:10:00",
        }
    )
    batch = {"seq": 0, "metrics": [{"line": 100_000, "t": time.time(), "raw": line}]}
    r = server.api.post(url, content=json.dumps(batch), headers=auth)
    assert r.status_code == 200, r.text

    # A timestamp or a reading that is not a number is refused by name, not stored or crashed on.
    for body, loc in (
        ('{"seq": 1, "metrics": [{"line": 100001, "t": NaN, "raw": "{}"}]}', ["metrics", 0, "t"]),
        (
            '{"seq": 1, "logs": [{"line": 9, "t": Infinity, "stream": "stdout", "text": "x"}]}',
            ["logs", 0, "t"],
        ),
        (
            '{"seq": 1, "memory": [{"line": 9, "t": 1.0, "gpu": -1, "used_bytes": 1, "util": NaN}]}',
            ["memory", 0, "util"],
        ),
    ):
        r = server.api.post(url, content=body, headers=auth)
        assert r.status_code == 422, (body, r.status_code, r.text)
        assert [d["loc"] for d in strict(r.text)["detail"]] == [["body", *loc]], r.text

    evs = stream_until(
        server, lambda e: (row := team_row(e, job["id"])) is not None and row["nonfinite"] is not None
    )
    assert team_row(evs, job["id"])["last_loss"] is None
    evs = stream_until(server, lambda e: any(m["nonfinite"] for m in rows_of(e, "metrics")), job=job["id"])
    assert [m["nonfinite"] for m in rows_of(evs, "metrics") if m["nonfinite"]] == [{"loss": "inf"}]
    # The alert engine reads the stored fact: the loss became inf.
    until(
        lambda: [a for a in get(server, f"/api/jobs/{job['id']}/alerts") if a["kind"] == "loss_nan"],
        "a loss_nan alert",
    )
    assert server.api.post(f"/api/jobs/{job['id']}/cancel").status_code == 200
    server.wait(job["id"], ("succeeded", "failed", "cancelled"))


def test_parse_point_keeps_columns_finite_and_names_the_rest():
    p = parse_point(
        json.dumps(
            {
                "current_steps": 7,
                "loss": INF,
                "eval_loss": NAN,
                "lr": -INF,
                "throughput": 1.5,
                "total_tokens": 10**400,
                "percentage": NAN,
            }
        )
    )
    assert (p["step"], p["loss"], p["eval_loss"], p["lr"], p["throughput"]) == (7, None, None, None, 1.5)
    assert p["total_tokens"] is None and p["percentage"] is None
    assert json.loads(p["nonfinite"]) == {
        "loss": "inf",
        "eval_loss": "nan",
        "lr": "-inf",
        "total_tokens": "inf",
    }
    assert (
        parse_point(json.dumps({"current_steps": 10**30, "loss": 1.0}))["step"] is None
    )  # past SQLite's integers
    assert parse_point(json.dumps({"loss": 1.0}))["nonfinite"] is None


def test_strictjson_never_writes_a_bare_token():
    value = {"a": [1.0, INF, {"b": NAN, "nonfinite": {"c": "nan"}, "c": None}], "d": -INF, "e": "NaN"}
    out = strict(strictjson.dumps(value))
    assert out == {
        "a": [1.0, None, {"b": None, "c": None, "nonfinite": {"c": "nan", "b": "nan"}}],
        "d": None,
        "e": "NaN",
        "nonfinite": {"d": "-inf"},
    }
    assert strictjson.dumps({"x": 1.5}) == json.dumps({"x": 1.5})
    assert [float(strictjson.name(x)) for x in (INF, -INF)] == [INF, -INF] and math.isnan(
        float(strictjson.name(NAN))
    )


def test_migration_moves_stored_infinity_and_nan_into_the_fact(tmp_path):
    engine = make_engine(tmp_path / "m.db")
    upgrade(engine, "0006")
    raw = [
        json.dumps({"current_steps": 1, "loss": 2.0}),
        json.dumps({"current_steps": 2, "loss": INF}),
        json.dumps({"current_steps": 3, "loss": NAN, "eval_loss": -INF}),
        '{"text": "NaN and Infinity"}',
    ]
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (id, name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at,"
                " last_batch_seq) VALUES (1, 'j', 'succeeded', 0, '{}', '', '', '', '2026-01-01', 0)"
            )
        )
        for i, (r, loss) in enumerate(zip(raw, (2.0, INF, None, None))):  # as the old ingest stored them
            c.execute(
                text(
                    "INSERT INTO metric_points (job_id, line, t, step, loss, eval_loss, raw) "
                    "VALUES (1, :i, :i, :i, :loss, :ev, :raw)"
                ),
                {"i": i, "loss": loss, "ev": -INF if i == 2 else None, "raw": r},
            )
    upgrade(engine)

    def stored() -> list:
        with engine.connect() as c:
            rows = c.execute(text("SELECT loss, eval_loss, nonfinite FROM metric_points ORDER BY line")).all()
        return [(a, b, json.loads(n) if n else None) for a, b, n in rows]

    assert stored() == [
        (2.0, None, None),
        (None, None, {"loss": "inf"}),
        (None, None, {"loss": "nan", "eval_loss": "-inf"}),
        (None, None, None),
    ]
    before = stored()
    downgrade(engine, "0006")  # the columns stay finite; the line as written still holds the fact
    upgrade(engine)
    assert stored() == before
