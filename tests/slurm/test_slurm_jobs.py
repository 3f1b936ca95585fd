"""Jobs on a two-node Slurm cluster (tests/slurm/conftest.py): the submit checks against what Slurm
says, a 1-node job through sbatch and srun, a 2-node ZeRO-3 job that waits with Slurm's reason while
the nodes are held, trains across both nodes through a server kill -9 and restart, and a cancel that
leaves nothing running. Real LLaMA-Factory runs of the tiny model, one shared server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.utils.servers import CONFIGS, demo_config, job_processes
from tests.utils.wait import until

pytestmark = pytest.mark.slow
ENDED = ("succeeded", "failed", "cancelled")


def zero3() -> dict:
    ds = json.loads((CONFIGS / "ds_z3_rocm.json").read_text())
    ds["fp16"]["enabled"] = False  # the CPU
    return ds


def slurm_id(job: dict) -> str:
    path = Path(job["run_dir"]) / "slurm.json"
    return until(lambda: path.exists() and json.loads(path.read_text())["job_id"], "the Slurm job id")


def assert_points_are_rank0s(server, job: dict) -> None:
    """The stored points are exactly rank 0's trainer_log.jsonl lines, once each."""
    points = server.all(job["id"], "metrics")
    lines = [json.loads(x) for x in (Path(job["output_dir"]) / "trainer_log.jsonl").read_text().splitlines()]
    assert points and [p["step"] for p in points] == [x["current_steps"] for x in lines]
    assert [p["loss"] for p in points] == [x.get("loss") for x in lines]


def left(job: dict) -> list:
    keys = [job["run_dir"]] + [f"{job['run_dir']}#rank{r}" for r in range(1, job["nodes"])]
    return [p for k in keys for p in job_processes(k)]


def test_a_job_that_can_never_fit_is_refused_naming_what_exists(slurm_server, assets):
    config = demo_config(assets, max_steps=2)
    post = slurm_server.api.post
    r = post("/api/jobs", json={"name": "too wide", "config": config, "gpus": 2})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert (
        err["loc"] == ["gpus"] and "largest node of partition tdk" in err["msg"] and "has 1" in err["msg"]
    ), err
    r = post("/api/jobs", json={"name": "too many", "config": config, "gpus": 1, "nodes": 3})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["nodes"] and "holds 2 such node(s)" in err["msg"], err
    r = post(
        "/api/jobs", json={"name": "nowhere", "config": config, "gpus": 1, "slurm": {"partition": "gpu"}}
    )
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["slurm", "partition"] and "the cluster has: tdk" in err["msg"], err
    r = post("/api/jobs", json={"name": "quoted", "config": config, "slurm": {"account": "a;rm -rf /"}})
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-2:] == ["slurm", "account"], r.text


def test_a_one_node_job_trains_through_sbatch_and_srun(slurm_server, assets):
    created = slurm_server.submit(
        {"name": "one", "config": demo_config(assets, max_steps=10), "gpus": 1, "slurm": {"time": "10:00"}}
    )
    job = slurm_server.wait(created["id"], ENDED, timeout=300)
    assert job["status"] == "succeeded", job
    assert_points_are_rank0s(slurm_server, job)
    script = slurm_server.api.get(f"/api/jobs/{job['id']}/config").json()["batch_script"]
    assert (
        "#SBATCH --nodes=1" in script
        and "#SBATCH --gres=gpu:1" in script
        and "#SBATCH --time=10:00" in script
    )
    assert script == (Path(job["run_dir"]) / "slurm.sh").read_text()
    assert not list(Path(job["run_dir"]).glob("runner.token*"))  # each token file is read once, then gone
    assert until(lambda: not left(job), "no process of the job left")
