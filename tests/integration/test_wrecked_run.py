"""A run that exits 0 but learned nothing is not a green "succeeded": learning_rate 1e8 on the demo
model (a real LLaMA-Factory run) is linted before launch (LF020), and after it the engine judges its
few points on what they show: zero gradients, the loss at ln(vocabulary)."""

from __future__ import annotations

import json
import math

import pytest

from tests.utils.servers import demo_config
from tests.utils.wait import until

pytestmark = pytest.mark.slow


def test_learning_rate_1e8_is_warned_at_submit_and_judged_wrecked_after(server_factory, assets):
    vocab = json.loads((assets / "demo" / "model" / "config.json").read_text())["vocab_size"]
    server = server_factory()
    created = server.submit(
        {
            "name": "lr 1e8",
            "config": demo_config(assets, learning_rate=1e8, max_steps=8, logging_steps=1, eval_steps=4),
            "gpus": 0,
        }
    )
    (lint,) = [f for f in created["findings"] if f["code"] == "LF020"]
    assert lint["severity"] == "warning" and "far above" in lint["message"]

    job = server.wait(created["id"], ("succeeded", "failed", "cancelled"), timeout=400)
    assert job["status"] == "succeeded" and job["exit_code"] == 0, job  # the run itself does not fail
    points = [p for p in server.all(job["id"], "metrics") if p["loss"] is not None]
    assert len(points) < 20  # too few for loss_stuck's window: judged on what is there
    assert points[-1]["grad_norm"] == 0.0

    def judged() -> dict | None:
        got = server.api.get(f"/api/jobs/{job['id']}").json()
        return got if got["verdict"] == "succeeded_with_problems" else None

    row = until(judged, "the run judged succeeded with problems", explain=lambda: server.explain(job["id"]))
    assert "no_gradient" in row["alerts"]["problems"], row["alerts"]
    (alert,) = [
        a for a in server.api.get(f"/api/jobs/{job['id']}/alerts").json() if a["kind"] == "no_gradient"
    ]
    assert alert["severity"] == "critical"
    assert f"= ln({vocab})" in alert["message"], alert  # the loss of a uniform guess, named
    assert abs(points[-1]["loss"] - math.log(vocab)) < 0.01 * math.log(vocab)
    assert alert["change"] == {"learning_rate": 1e-4}, alert
