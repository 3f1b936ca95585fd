"""Nodes that cannot reach the server (TUNEDECK_RUNNER_TRANSPORT=files): a 2-node Slurm job whose
runners are told a server URL nobody answers trains across both nodes, each runner's outbox in the
shared run folder is the only road its telemetry takes, and the server stores every point of rank 0
once, the memory of both nodes, and the cancel's end, with nothing left on either node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.slurm.conftest import slurm_settings
from tests.slurm.test_slurm_jobs import ENDED, assert_points_are_rank0s, left
from tests.utils.servers import Server, demo_config, free_port
from tests.utils.wait import RUN_DEADLINE, until

# Real multi-stage runs: their own waits (each with an account of the job) end them, not the suite-wide 600 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def files_server(slurm_cluster, assets, tmp_path_factory):
    server = Server(
        tmp_path_factory.mktemp("slurmfiles") / "ws",
        assets,
        **slurm_settings(slurm_cluster),
        TUNEDECK_RUNNER_TRANSPORT="files",
        TUNEDECK_SERVER_URL=f"http://127.0.0.1:{free_port()}",  # nobody answers there
        TUNEDECK_OUTBOX_POLL_S="0.5",
    )
    yield server.start()
    server.stop()


def test_a_two_node_job_reports_through_the_shared_run_folder_only(files_server, assets):
    config = demo_config(assets, max_steps=2000, save_steps=1000, eval_steps=1000, logging_steps=1)
    job = files_server.submit({"name": "offline nodes", "config": config, "gpus": 1, "nodes": 2})

    def live(n: int):
        got = files_server.api.get(f"/api/jobs/{job['id']}").json()
        points = files_server.all(job["id"], "metrics")
        return got["status"] == "running" and len(points) >= n and points

    until(lambda: live(3), "points while it trains, from rank 0's outbox", timeout=400)
    for rank in (0, 1):
        cfg = json.loads(
            (Path(job["run_dir"]) / ("runner.json" if not rank else "runner.rank1.json")).read_text()
        )
        assert cfg["transport"] == "files" and cfg["server_url"].startswith("http://127.0.0.1:"), cfg
    nodes = until(
        lambda: len(d := files_server.api.get(f"/api/jobs/{job['id']}/memory").json()["gpus"]) >= 2 and d,
        "memory from both nodes' outboxes",
    )
    assert {d["node"] for d in nodes} == {"n1", "n2"}, nodes
    assert files_server.api.post(f"/api/jobs/{job['id']}/cancel").status_code == 200
    ended = files_server.wait(job["id"], ENDED, timeout=RUN_DEADLINE)
    assert ended["status"] == "cancelled" and ended["exit_code"] == 0, ended
    assert (Path(ended["output_dir"]) / "adapter_model.safetensors").exists()
    assert_points_are_rank0s(files_server, ended)
    logs = " ".join(g["text"] for g in files_server.all(job["id"], "logs"))
    assert "[rank 1]" in logs, logs[-2000:]  # rank 1's output came through its own outbox
    assert until(lambda: not left(ended), "no process of the job left on either node", timeout=120)
