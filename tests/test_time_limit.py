"""A run its allocation's time limit stops goes on by itself (services/jobs/resume.py): a runner warned
with SIGUSR1 (what Slurm's `--signal=USR1@N` sends every task of the step) stops the real trainer after
a step with a checkpoint, the job fails naming the time limit, and a new attempt resumes that
checkpoint and continues its steps, up to TUNEDECK_AUTO_RESUME_ATTEMPTS attempts in a row."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import yaml

from tests.security.test_crash import runner_pid
from tests.utils.servers import demo_config, job_processes
from tests.utils.wait import until

ENDED = ("failed", "cancelled", "succeeded")


def warn_at_step(server, job: dict, step: int) -> None:
    """SIGUSR1 to the job's runner once the trainer has logged `step` (the trainer itself ignores it)."""
    until(
        lambda: any((p.get("step") or 0) >= step for p in server.all(job["id"], "metrics")),
        f"job {job['id']} at step {step}",
        explain=lambda: server.explain(job["id"]),
    )
    pid = until(lambda: runner_pid(job, missing_ok=True), f"job {job['id']}'s runner")
    os.kill(pid, signal.SIGUSR1)


def test_a_time_limit_warning_saves_and_the_next_attempt_continues(server_factory, assets, page):
    server = server_factory(TUNEDECK_AUTO_RESUME_ATTEMPTS="1")
    config = demo_config(assets, max_steps=10**4, save_steps=10**4, eval_steps=10**4, logging_steps=1)
    first = server.submit({"name": "long", "config": config, "gpus": 0})
    warn_at_step(server, first, 2)

    stopped = server.wait(first["id"], ENDED)
    assert stopped["status"] == "failed", stopped
    assert stopped["error"].startswith("stopped for its allocation's time limit"), stopped["error"]
    assert job_processes(stopped["run_dir"]) == []  # the trainer and its workers are gone
    saved = server.api.get(f"/api/jobs/{first['id']}/checkpoints").json()
    assert saved, "no checkpoint saved at the warning"
    last = max(p["step"] for p in server.all(first["id"], "metrics") if p.get("step") is not None)
    assert saved[-1]["step"] == last  # the checkpoint of the step it stopped after

    done = until(
        lambda: (server.api.get(f"/api/jobs/{first['id']}").json()["auto_resume"] or "").startswith(
            "resumed"
        ),
        f"job {first['id']} resumed",
    )
    assert done
    resumed = server.api.get(f"/api/jobs/{first['id']}").json()["auto_resume"]
    child_id = int(resumed.removeprefix("resumed as job "))
    child = server.api.get(f"/api/jobs/{child_id}").json()
    assert child["parent_id"] == first["id"] and child["owner"] == stopped["owner"]
    page.goto(f"{server.url}/jobs/{first['id']}")  # the stopped attempt's page links the next one
    page.locator("#auto-resume a").wait_for()
    assert page.locator("#auto-resume a").get_attribute("href") == f"/jobs/{child_id}"
    train = yaml.safe_load(server.api.get(f"/api/jobs/{child_id}/config").json()["train_yaml"])
    assert Path(train["resume_from_checkpoint"]).name == saved[-1]["name"]

    # The next attempt continues the steps where the checkpoint left them, on one curve with its parent.
    warn_at_step(server, child, last + 2)
    steps = [p["step"] for p in server.all(child_id, "metrics") if p.get("step") is not None]
    assert min(steps) == last + 1, steps
    lineage = server.api.get(f"/api/jobs/{child_id}/series", params={"lineage": 1}).json()
    assert [a["job_id"] for a in lineage["lineage"]] == [first["id"], child_id], lineage["lineage"]

    # Warned again: the one attempt TUNEDECK_AUTO_RESUME_ATTEMPTS allows is spent, so it stays stopped.
    again = server.wait(child_id, ENDED)
    assert again["status"] == "failed" and again["error"].startswith(
        "stopped for its allocation's time limit"
    )
    said = until(
        lambda: (server.api.get(f"/api/jobs/{child_id}").json()["auto_resume"] or "").startswith("not"),
        f"job {child_id}'s auto_resume settled",
    )
    assert said
    note = server.api.get(f"/api/jobs/{child_id}").json()["auto_resume"]
    assert note.startswith("not resumed: 1 attempts in a row were stopped by the end of their allocation"), (
        note
    )
    assert [j["id"] for j in server.api.get("/api/jobs").json()["jobs"]] == [child_id, first["id"]]
    page.goto(f"{server.url}/jobs/{child_id}")
    page.wait_for_function(
        "(document.querySelector('#auto-resume') || {}).textContent?.startsWith('not resumed')"
    )
    assert page.errors == []
