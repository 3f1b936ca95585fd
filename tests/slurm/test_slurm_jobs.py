"""Jobs on a two-node Slurm cluster (tests/slurm/conftest.py): the submit checks against what Slurm
says, a 1-node job through sbatch and srun, a 2-node job that waits with Slurm's reason while
the nodes are held, trains across both nodes through a server kill -9 and restart, and a cancel that
leaves nothing running. Real LLaMA-Factory runs of the tiny model, one shared server.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.utils.servers import demo_config, job_processes
from tests.utils.wait import until

pytestmark = pytest.mark.slow
ENDED = ("succeeded", "failed", "cancelled")


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


def test_the_nodes_page_lists_slurms_nodes_with_a_drained_ones_reason(slurm_cluster, slurm_server):
    def listed() -> dict:
        r = slurm_server.api.get("/api/nodes")
        assert r.status_code == 200, r.text
        return {n["name"]: n for n in r.json()}

    nodes = listed()
    assert nodes.keys() == {"n1", "n2"} and all(n["backend"] == "slurm" for n in nodes.values()), nodes
    assert [len(n["gpus"]) for n in nodes.values()] == [1, 1] and nodes["n1"]["address"] == "127.0.0.1"
    slurm_cluster.run("scontrol", "update", "nodename=n2", "state=drain", "reason=disk swap")
    try:
        drained = until(lambda: "DRAIN" in (n := listed()["n2"])["state"] and n, "n2 drained on the page")
        assert "drained" in drained["reason"] and "disk swap" in drained["reason"], drained
    finally:
        slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume")
    until(lambda: listed()["n2"]["reason"] is None, "n2 back")


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


def test_two_node_job_waits_for_slurm_then_trains_through_restart_and_cancel(
    slurm_cluster, slurm_server, assets
):
    """Two 1-node jobs hold both nodes; a 2-node job (torchrun across the nodes, DDP over gloo: a
    ZeRO-3 run would first compile DeepSpeed's CPU op, a minute or more here) waits with Slurm's reason, starts when they
    end, trains across both nodes through a server kill -9 and restart, and a cancel stops both ranks
    after a step with the adapter saved, leaving nothing running and nothing in Slurm's queue."""
    small = [
        slurm_server.submit({"name": f"small {i}", "config": demo_config(assets, max_steps=6), "gpus": 1})
        for i in range(2)
    ]
    wide = slurm_server.submit(
        {
            "name": "wide",
            "config": demo_config(assets, max_steps=2000, save_steps=1000, eval_steps=1000),
            "gpus": 1,
            "nodes": 2,
        }
    )
    for job in small:
        slurm_server.wait(job["id"], ("running",), timeout=300)

    def waiting() -> str | None:
        got = slurm_server.api.get(f"/api/jobs/{wide['id']}").json()
        return (
            got["status"] == "queued"
            and (got["waiting_for"] or "").startswith("Slurm job")
            and "not yet looked" not in got["waiting_for"]  # until Slurm's scheduler has judged it
            and got["waiting_for"]
        )

    said = until(waiting, "the 2-node job waiting with Slurm's reason")
    assert "pending" in said and ("Resources" in said or "Priority" in said), said
    for job in small:
        done = slurm_server.wait(job["id"], ENDED, timeout=300)
        assert done["status"] == "succeeded", done

    slurm_server.wait(wide["id"], ("running",), timeout=300)
    held = {n["name"]: n["jobs"] for n in slurm_server.api.get("/api/nodes").json()}
    assert held == {"n1": [wide["id"]], "n2": [wide["id"]]}, held  # the nodes page names the holder
    seen = len(
        until(lambda: slurm_server.all(wide["id"], "metrics"), "the 2-node job's first points", timeout=300)
    )
    slurm_server.kill()  # Slurm holds the job: training goes on without the server
    slurm_server.start()
    until(
        lambda: len(slurm_server.all(wide["id"], "metrics")) > seen, "points after the restart", timeout=300
    )
    assert slurm_server.api.get(f"/api/jobs/{wide['id']}").json()["status"] == "running"

    assert slurm_server.api.post(f"/api/jobs/{wide['id']}/cancel").status_code == 200
    job = slurm_server.wait(wide["id"], ENDED, timeout=300)
    assert job["status"] == "cancelled" and job["exit_code"] == 0, job  # stopped after a step
    assert (Path(job["output_dir"]) / "adapter_model.safetensors").exists()
    assert_points_are_rank0s(slurm_server, job)  # nothing lost across the restart
    devices = slurm_server.api.get(f"/api/jobs/{wide['id']}/memory").json()["gpus"]
    assert {d["node"] for d in devices} == {"n1", "n2"}, devices  # one series per node
    logs = " ".join(g["text"] for g in slurm_server.all(job["id"], "logs"))
    assert "[rank 1]" in logs and "SIGABRT" in logs and "world size: 2" in logs, logs[-2000:]
    assert until(lambda: not left(job), "no process of the job left on either node", timeout=120)
    sid = slurm_id(job)
    assert until(
        lambda: (
            slurm_cluster.run("squeue", "-h", "-j", sid, "-t", "all", "-o", "%T").strip() in ("", "COMPLETED")
        ),
        "the Slurm job ended",
    )


def test_a_time_limit_warning_saves_a_checkpoint_and_the_run_resumes(slurm_server, assets):
    """A 4-minute limit with the server's 150 s warning: Slurm sends the runner SIGUSR1 (`--signal`), the
    trainer stops after a step with a checkpoint, the job fails naming the time limit and a new attempt,
    submitted by the server through sbatch, continues from the next step; cancelled, nothing is left."""
    config = demo_config(assets, max_steps=10**4, save_steps=10**4, eval_steps=10**4, logging_steps=1)
    first = slurm_server.submit({"name": "limited", "config": config, "gpus": 1, "slurm": {"time": "4"}})
    script = slurm_server.api.get(f"/api/jobs/{first['id']}/config").json()["batch_script"]
    assert "#SBATCH --signal=USR1@150" in script and "#SBATCH --time=4" in script, script
    stopped = slurm_server.wait(first["id"], ENDED, timeout=420)
    assert stopped["status"] == "failed", stopped
    assert stopped["error"].startswith("stopped for its allocation's time limit"), stopped["error"]
    saved = slurm_server.api.get(f"/api/jobs/{first['id']}/checkpoints").json()
    last = max(p["step"] for p in slurm_server.all(first["id"], "metrics") if p.get("step") is not None)
    assert saved and saved[-1]["step"] == last, (saved, last)

    def resumed() -> int | None:
        said = slurm_server.api.get(f"/api/jobs/{first['id']}").json()["auto_resume"] or ""
        assert not said.startswith("not"), said
        return int(said.removeprefix("resumed as job ")) if said.startswith("resumed") else None

    child = slurm_server.api.get(f"/api/jobs/{until(resumed, 'the next attempt')}").json()
    assert child["parent_id"] == first["id"]
    points = until(
        lambda: [p for p in slurm_server.all(child["id"], "metrics") if p.get("step") is not None],
        "the next attempt's first points",
        timeout=300,
    )
    assert points[0]["step"] == last + 1, points[:3]
    assert slurm_server.api.post(f"/api/jobs/{child['id']}/cancel").status_code == 200
    ended = slurm_server.wait(child["id"], ENDED, timeout=300)
    assert ended["status"] == "cancelled", ended
    assert until(lambda: not left(stopped) and not left(ended), "no process of either attempt left")
