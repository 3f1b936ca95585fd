"""The files transport (TUNEDECK_RUNNER_TRANSPORT=files), on the local executor: a real fine-tune whose
runner is given a server URL nobody answers, so all it reports goes through its outbox in the run
folder while it trains; the server, killed -9 and started again mid-run, stores every point once and
loses none; a stack dump asked through the API comes back through the run folder too.
(tests/slurm/test_slurm_outbox.py runs the same across two Slurm nodes.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.utils.servers import Server, demo_config, free_port, job_processes
from tests.utils.wait import until

# Real multi-stage runs: their own waits (each with an account of the job) end them, not the suite-wide 600 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
ENDED = ("succeeded", "failed", "cancelled")


def points_are_the_trainers(server: Server, job: dict) -> list[dict]:
    """The stored points are exactly the trainer_log.jsonl lines, once each."""
    points = server.all(job["id"], "metrics")
    lines = [json.loads(x) for x in (Path(job["output_dir"]) / "trainer_log.jsonl").read_text().splitlines()]
    assert points and [p["step"] for p in points] == [x["current_steps"] for x in lines]
    assert [p["loss"] for p in points] == [x.get("loss") for x in lines]
    return points


def test_a_runner_that_cannot_reach_the_server_reports_through_its_run_folder(tmp_path, assets):
    nobody = f"http://127.0.0.1:{free_port()}"  # what the runner is told: no server ever answers there
    server = Server(
        tmp_path / "ws",
        assets,
        TUNEDECK_RUNNER_TRANSPORT="files",
        TUNEDECK_SERVER_URL=nobody,
        TUNEDECK_OUTBOX_POLL_S="0.3",
    ).start()
    try:
        config = demo_config(assets, max_steps=2000, save_steps=1000, eval_steps=1000, logging_steps=1)
        job = server.submit({"name": "offline", "config": config})
        written = Path(job["run_dir"]) / "runner.json"
        runner = json.loads(
            until(lambda: written.exists() and written.read_text(), "the runner's configuration")
        )
        assert runner["transport"] == "files" and runner["server_url"] == nobody

        def live(n: int):
            got = server.api.get(f"/api/jobs/{job['id']}").json()
            points = server.all(job["id"], "metrics")
            return got["status"] == "running" and len(points) >= n and points

        seen = len(until(lambda: live(2), "points while it trains, read from the outbox", timeout=300))
        until(lambda: server.api.get(f"/api/jobs/{job['id']}/memory").json()["gpus"], "memory samples")

        asked = server.api.post(f"/api/jobs/{job['id']}/stacks")
        assert asked.status_code == 202, asked.text
        number = asked.json()["request"]
        asks = Path(job["run_dir"]) / "stacks.asked"
        until(
            lambda: asks.exists() and asks.read_text().strip() == str(number), "the request in the run folder"
        )
        dumps = until(
            lambda: (d := server.api.get(f"/api/jobs/{job['id']}/stacks").json())["nodes"] and d,
            "the runner's stack report, taken from the run folder",
            timeout=180,
        )
        (node,) = dumps["nodes"]
        assert dumps["request"] == number and node["error"] is None, node
        why = [(p["pid"], p.get("error"), len(p.get("threads") or [])) for p in node["processes"]]
        assert node["processes"] and any(p.get("threads") for p in node["processes"]), why
        assert dumps["summary"], dumps

        server.kill()  # the runner trains on; the next server reads the outbox from its start
        server.start()
        until(lambda: live(seen + 3), "points after the restart", timeout=300)
        assert server.api.post(f"/api/jobs/{job['id']}/cancel").status_code == 200
        ended = server.wait(job["id"], ENDED, timeout=300)
        assert ended["status"] == "cancelled" and ended["exit_code"] == 0, ended
        points_are_the_trainers(server, ended)  # each once: the outbox read twice added nothing
        assert until(lambda: not job_processes(job["run_dir"]), "no process of the job left")
        said = (Path(job["run_dir"]) / "runner.log").read_text()
        assert "left in the outbox" not in said, said[-2000:]  # it never waited for a server to answer
    finally:
        server.stop()
