"""A run that exits 0 but learned nothing is not a green "succeeded": learning_rate 1e8 on the demo
model (a real LLaMA-Factory run) is linted before launch (LF020), and after it the engine judges its
few points on what they show: zero gradients, the loss at ln(vocabulary). The pages say so at 1440 and
390 px, and the CPU run's memory chart ends at the trainer's last reading, not in a drop to 0 B."""

from __future__ import annotations

import json
import math

import pytest

from tests.utils.browser import shot
from tests.utils.servers import demo_config
from tests.utils.wait import until

pytestmark = [pytest.mark.slow, pytest.mark.browser]


def test_learning_rate_1e8_is_warned_at_submit_and_judged_wrecked_after(server_factory, assets, page):
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

    # The pages: not a green "succeeded" anywhere, the cause on the job page, at both widths.
    for width, height in ((1440, 900), (390, 844)):
        page.set_viewport_size({"width": width, "height": height})
        page.goto(f"{server.url}/")
        row = page.locator(f'tr[data-job="{job["id"]}"]')
        row.wait_for()
        assert "succeeded with problems" in row.inner_text()
        page.goto(f"{server.url}/jobs/{job['id']}")
        page.wait_for_function("window.tunedeckReady === true")
        assert page.locator("#status").inner_text() == "succeeded with problems"
        item = page.locator('.alert-item[data-kind="no_gradient"]')
        item.wait_for()
        assert f"ln({vocab})" in item.inner_text() and "learning_rate" in item.inner_text()
        # Host memory (a CPU run): every reading is the trainer's, the last one too (no 0 B after it).
        page.wait_for_function("[...window.tunedeck.mem.values()].some(g => g.y.length >= 2)")
        curves = page.evaluate("[...window.tunedeck.mem.values()].map(g => g.y)")
        assert curves and all(min(y) > 0 for y in curves), [(min(y), y[-1]) for y in curves]
        shot(page, f"wrecked-run-{width}")
    assert page.errors == []
