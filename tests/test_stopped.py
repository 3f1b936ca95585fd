"""A stopped job says who stopped it, at which step, and whether its adapter was saved (API)."""

from __future__ import annotations

from pathlib import Path

from tests.utils.factories import create_job, create_token, post_telemetry
from tests.utils.servers import demo_config

RUNNER = "runner-secret"


def points(n: int) -> list[dict]:
    return [
        {"current_steps": k, "total_steps": 10, "loss": 3.0 - k / 10, "lr": 2e-4, "percentage": 10 * k}
        for k in range(1, n + 1)
    ]


def stopped_job(app, assets, *, owner: str, adapter: bool, steps: int = 3):
    job = create_job(
        app.engine, app.settings, config=demo_config(assets), name="stop-me", owner=owner, runner_token=RUNNER
    )
    token = create_token(app.engine, owner)
    assert post_telemetry(app.api, job.id, RUNNER, seq=0, points=points(steps)).status_code == 200
    out = Path(job.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    if adapter:  # what LLaMA-Factory's graceful stop writes into the output root
        (out / "adapter_model.safetensors").write_bytes(b"\0" * 16)
        (out / "adapter_config.json").write_text("{}")
    r = app.api.post(f"/api/jobs/{job.id}/cancel", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 200, r.text
    # The runner reports the stop, unless the scheduler, seeing the signalled stand-in gone, ended it first.
    states = [{"event": "exited", "exit_code": 0, "cancelled": True}]
    assert post_telemetry(app.api, job.id, RUNNER, seq=1, states=states).status_code in (200, 401)
    app.wait(job.id, ("cancelled",), timeout=120)
    return app.api.get(f"/api/jobs/{job.id}").json()


def test_a_stopped_job_says_who_stopped_it_at_which_step_and_what_it_saved(app_factory, assets):
    app = app_factory()
    got = stopped_job(app, assets, owner="alice", adapter=True)
    assert got["status"] == "cancelled"
    assert got["stopped"] == "stopped by alice at step 3, adapter saved"
    got = stopped_job(app, assets, owner="bob", adapter=False, steps=2)
    assert got["stopped"] == "stopped by bob at step 2, no adapter saved"
    listed = {j["id"]: j for j in app.api.get("/api/jobs").json()["jobs"]}
    assert listed[got["id"]]["stopped"] == got["stopped"]
    queued = app.submit({"name": "never-ran", "config": demo_config(assets), "gpus": 0})
    assert queued["stopped"] is None
    got = app.api.post(f"/api/jobs/{queued['id']}/cancel").json()  # an open server: no token
    assert got["stopped"] == "cancelled by a request without a token before it started"
