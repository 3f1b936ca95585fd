"""A resumed run's lineage as one curve (`GET /api/jobs/{id}/series?lineage=1`): the runs it resumed
(through parent_id, each from a checkpoint) up to the step the next resumed at, then its own points,
each point naming its job; a clone's parent is another run, not an attempt."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.utils.servers import demo_config


@pytest.fixture(scope="module")
def app(tmp_path_factory, assets):
    from tests.utils.app import App

    a = App(tmp_path_factory.mktemp("lineage") / "ws", assets).start()
    yield a
    a.stop()


def logged(app, job_id: int, steps: range, t0: float) -> None:
    """Trainer-log rows of a job as ingest stores them (loss by step, an eval every 10 steps)."""
    rows = []
    for i, s in enumerate(steps):
        line = {"current_steps": s, "loss": 3.0 - s / 100 + job_id / 1000, "lr": 1e-4}
        rows.append(
            {
                "j": job_id,
                "line": 2 * i,
                "step": s,
                "t": t0 + s,
                "loss": line["loss"],
                "lr": 1e-4,
                "raw": json.dumps(line),
            }
        )
        if s % 10 == 0:
            rows.append(
                {
                    "j": job_id,
                    "line": 2 * i + 1,
                    "step": s,
                    "t": t0 + s,
                    "loss": None,
                    "lr": None,
                    "raw": "{}",
                }
            )
    with app.engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO metric_points (job_id, line, step, t, loss, lr, raw) "
                "VALUES (:j, :line, :step, :t, :loss, :lr, :raw)"
            ),
            rows,
        )


def resumed(app, parent: dict, step: int) -> dict:
    out = Path(parent["output_dir"]) / f"checkpoint-{step}"
    out.mkdir(parents=True)
    for f in (
        "adapter_model.safetensors",
        "optimizer.pt",
        "scheduler.pt",
        "rng_state.pth",
        "trainer_state.json",
    ):
        (out / f).write_bytes(b"x")
    r = app.api.post(f"/api/jobs/{parent['id']}/resume", json={"checkpoint": f"checkpoint-{step}"})
    assert r.status_code == 201, r.text
    return r.json()


def test_a_resumed_run_continues_its_parents_curve(app, assets):
    first = app.submit({"name": "long run", "config": demo_config(assets), "gpus": 0})
    logged(app, first["id"], range(1, 26), 1000.0)  # stopped at 25, checkpoint at 10
    second = resumed(app, first, 10)
    logged(app, second["id"], range(11, 34), 2000.0)  # crashed at 33, checkpoint at 30
    third = resumed(app, second, 30)
    logged(app, third["id"], range(31, 51), 3000.0)
    ids = [first["id"], second["id"], third["id"]]

    r = app.api.get(f"/api/jobs/{third['id']}/series", params={"lineage": 1, "max_points": 500})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(a["job_id"], a["resumed_at"], a["first_step"], a["last_step"]) for a in body["lineage"]] == [
        (ids[0], None, 1, 10),
        (ids[1], 10, 11, 30),
        (ids[2], 30, 31, 50),
    ]
    loss = body["series"]["loss"]
    assert loss["step"] == list(range(1, 51))  # one curve: no step twice, none missing
    want = [ids[0]] * 10 + [ids[1]] * 20 + [ids[2]] * 20
    assert loss["job"] == want
    assert loss["y"] == pytest.approx([3.0 - s / 100 + j / 1000 for s, j in zip(range(1, 51), want)])
    assert loss["t"][9:11] == [1010.0, 2011.0] and loss["n"] == 50
    assert body["count"] == 11 + 22 + 22  # rows in the curve, evals too: the steps each attempt kept

    # A zoomed window cuts across attempts the same way; downsampled, the points share out.
    z = app.api.get(f"/api/jobs/{third['id']}/series", params={"lineage": 1, "x0": 25, "x1": 35}).json()
    assert z["series"]["loss"]["step"] == list(range(25, 36))
    assert [a["job_id"] for a in z["lineage"]] == ids[1:]
    small = app.api.get(f"/api/jobs/{third['id']}/series", params={"lineage": 1, "max_points": 20}).json()
    assert small["downsampled"] and len(small["series"]["loss"]["step"]) <= 3 * 20
    assert small["series"]["loss"]["step"] == sorted(small["series"]["loss"]["step"])

    # Without lineage, or from the middle attempt: its own steps, no lineage said.
    own = app.api.get(f"/api/jobs/{third['id']}/series").json()
    assert own["series"]["loss"]["step"] == list(range(31, 51)) and own.get("lineage") is None
    mid = app.api.get(f"/api/jobs/{second['id']}/series", params={"lineage": 1}).json()
    assert mid["series"]["loss"]["step"] == list(range(1, 34))
    assert [a["job_id"] for a in mid["lineage"]] == ids[:2]

    # A clone ("Edit as new") has a parent but starts afresh: its lineage is itself.
    clone = app.api.post(f"/api/jobs/{first['id']}/clone", json={"overrides": {}})
    assert clone.status_code == 201, clone.text
    clone = clone.json()
    logged(app, clone["id"], range(1, 6), 4000.0)
    alone = app.api.get(f"/api/jobs/{clone['id']}/series", params={"lineage": 1}).json()
    assert [a["job_id"] for a in alone["lineage"]] == [clone["id"]]
    assert alone["series"]["loss"]["step"] == [1, 2, 3, 4, 5]
