"""A runner stopped by a signal that no cancel of tunedeck's sent (Slurm's SIGTERM at a node failure,
a time limit, a preemption or an admin's scancel) ends its job failed, saying so; a cancel asked for
through the API still ends it cancelled (services/ingest/writer.py, OUTSIDE_STOP)."""

from __future__ import annotations

import os
import signal

from tests.security.test_crash import runner_pid
from tests.utils.servers import demo_config, job_processes
from tests.utils.standin import training_env
from tests.utils.wait import until


def runner_of(job: dict) -> int:
    return until(lambda: runner_pid(job, missing_ok=True), f"job {job['id']}'s runner")


def test_a_sigterm_from_outside_fails_the_job_and_a_cancel_cancels_it(server_factory, assets, tmp_path):
    server = server_factory(TUNEDECK_TRAIN_PYTHON=str(training_env(tmp_path / "env")), TUNEDECK_CPU_SLOTS="2")
    # `held` stand-ins: each blocks until released, as a long training step would.
    outside, asked = (
        server.submit({"name": f"held {n}", "config": demo_config(assets), "gpus": 0})
        for n in ("outside", "asked")
    )
    for job in (outside, asked):
        until(
            lambda j=job: any(x["text"] == "first line" for x in server.all(j["id"], "logs")), "the stand-in"
        )

    os.kill(runner_of(outside), signal.SIGTERM)  # what Slurm sends the step's processes
    assert server.api.post(f"/api/jobs/{asked['id']}/cancel").status_code == 200

    failed = server.wait(outside["id"], ("failed", "cancelled", "succeeded"))
    assert failed["status"] == "failed", failed
    assert failed["error"].startswith("stopped from outside tunedeck"), failed["error"]
    cancelled = server.wait(asked["id"], ("failed", "cancelled", "succeeded"))
    assert cancelled["status"] == "cancelled", cancelled
    assert job_processes(failed["run_dir"]) == [] and job_processes(cancelled["run_dir"]) == []
