"""Jobs on a two-node Slurm cluster (tests/slurm/conftest.py): the submit checks against what Slurm
says, a 1-node job through sbatch and srun, a 2-node ZeRO-3 job that waits with Slurm's reason while
the nodes are held, trains across both nodes through a server kill -9 and restart, and a cancel that
leaves nothing running; a time limit's warning and the next attempt; a node whose slurmd dies mid-job.
Real LLaMA-Factory runs of the tiny model, one shared server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest

from tests.utils.servers import demo_config, job_processes, zero3
from tests.utils.wait import RUN_DEADLINE, until
from tunedeck.scheduling.executors.slurm.cluster import seconds

# Real multi-stage runs: their own waits (each with an account of the job) end them, not the suite-wide 600 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
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


def extension_dirs(job: dict, rank: int) -> set[str | None]:
    """The TORCH_EXTENSIONS_DIR of every process the job's runner of `rank` runs (torchrun, the trainers)."""
    from tunedeck.procs import job_processes as find  # now, not after the settle `job_processes` waits for

    out = set()
    for p in find(job["run_dir"] if rank == 0 else f"{job['run_dir']}#rank{rank}"):
        with contextlib.suppress(psutil.Error):
            out.add(p.environ().get("TORCH_EXTENSIONS_DIR"))
    return out


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
    r = post(
        "/api/jobs",
        json={
            "name": "too long",
            "config": config,
            "gpus": 1,
            "slurm": {"partition": "urgent", "time": "1-0"},
        },
    )
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["slurm", "time"] and "partition urgent allows at most 00:05:00" in err["msg"], err
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
    job = slurm_server.wait(created["id"], ENDED, timeout=RUN_DEADLINE)
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
    """Two 1-node jobs hold both nodes; a 2-node ZeRO-3 job (torchrun across the nodes, DeepSpeed over
    gloo) waits with Slurm's reason, starts when they end, trains across both nodes through a server
    kill -9 and restart, and a cancel stops both ranks after a step with the adapter saved, leaving
    nothing running and nothing in Slurm's queue. Its runners see the session's TORCH_EXTENSIONS_DIR
    (sbatch exports the server's environment), so DeepSpeed's CPU op built by an earlier test is
    reused; the first to need it builds it there (a minute or more here)."""
    small = [
        slurm_server.submit({"name": f"small {i}", "config": demo_config(assets, max_steps=6), "gpus": 1})
        for i in range(2)
    ]
    wide = slurm_server.submit(
        {
            "name": "wide",
            "config": demo_config(assets, max_steps=2000, save_steps=1000, eval_steps=1000),
            "deepspeed": zero3(),
            "gpus": 1,
            "nodes": 2,
        }
    )
    for job in small:
        slurm_server.wait(job["id"], ("running",), timeout=RUN_DEADLINE)

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
        done = slurm_server.wait(job["id"], ENDED, timeout=RUN_DEADLINE)
        assert done["status"] == "succeeded", done

    slurm_server.wait(wide["id"], ("running",), timeout=RUN_DEADLINE)
    held = {n["name"]: n["jobs"] for n in slurm_server.api.get("/api/nodes").json()}
    assert held == {"n1": [wide["id"]], "n2": [wide["id"]]}, held  # the nodes page names the holder
    seen = len(
        until(
            lambda: slurm_server.all(wide["id"], "metrics"),
            "the 2-node job's first points",
            timeout=RUN_DEADLINE,
        )
    )
    ours = os.environ["TORCH_EXTENSIONS_DIR"]  # tests/conftest.py's, for every process of the session
    seen_dirs = {r: extension_dirs(wide, r) for r in (0, 1)}
    assert seen_dirs == {0: {ours}, 1: {ours}}, seen_dirs
    slurm_server.kill()  # Slurm holds the job: training goes on without the server
    slurm_server.start()
    until(
        lambda: len(slurm_server.all(wide["id"], "metrics")) > seen,
        "points after the restart",
        timeout=RUN_DEADLINE,
    )
    assert slurm_server.api.get(f"/api/jobs/{wide['id']}").json()["status"] == "running"

    assert slurm_server.api.post(f"/api/jobs/{wide['id']}/cancel").status_code == 200
    job = slurm_server.wait(wide["id"], ENDED, timeout=RUN_DEADLINE)
    assert job["status"] == "cancelled" and job["exit_code"] == 0, job  # stopped after a step
    assert (Path(job["output_dir"]) / "adapter_model.safetensors").exists()
    assert_points_are_rank0s(slurm_server, job)  # nothing lost across the restart
    devices = slurm_server.api.get(f"/api/jobs/{wide['id']}/memory").json()["gpus"]
    assert {d["node"] for d in devices} == {"n1", "n2"}, devices  # one series per node
    logs = [g["text"] for g in slurm_server.all(job["id"], "logs")]
    assert "SIGABRT" in " ".join(logs), logs[-20:]
    # A multi-node job meets all its ranks in one all-reduce before training, unasked (checks/spec.py).
    assert any(x.startswith("tunedeck collective check: all-reduce over 2 ranks on ") for x in logs), logs[
        :40
    ]
    config = slurm_server.api.get(f"/api/jobs/{job['id']}/config").json()
    assert json.loads(config["ds_config"])["zero_optimization"]["stage"] == 3
    for rank in (0, 1):  # each rank's trainer ran ZeRO-3 in a world of two (rank 1's lines say "[rank 1]")
        said = " ".join(x for x in logs if x.startswith("[rank 1] ") == (rank == 1))
        assert f"Process rank: {rank}, world size: 2" in said, said[-2000:]
        assert "Detected DeepSpeed ZeRO-3" in said and "DeepSpeed ZeRO3 detected" in said, said[-2000:]
    assert until(lambda: not left(job), "no process of the job left on either node", timeout=120)
    sid = slurm_id(job)
    assert until(
        lambda: (
            slurm_cluster.run("squeue", "-h", "-j", sid, "-t", "all", "-o", "%T").strip() in ("", "COMPLETED")
        ),
        "the Slurm job ended",
    )


def continued(server, stopped: dict) -> dict:
    """The attempt the server made after `stopped` ended with a checkpoint at its last logged step:
    it is `stopped`'s child and its first logged step is the one after."""
    saved = server.api.get(f"/api/jobs/{stopped['id']}/checkpoints").json()
    last = max(p["step"] for p in server.all(stopped["id"], "metrics") if p.get("step") is not None)
    assert saved and saved[-1]["step"] == last, (saved, last)

    def resumed() -> int | None:
        said = server.api.get(f"/api/jobs/{stopped['id']}").json()["auto_resume"] or ""
        assert not said.startswith("not"), said
        return int(said.removeprefix("resumed as job ")) if said.startswith("resumed") else None

    child_id = until(resumed, f"the attempt after job {stopped['id']}")
    child = server.api.get(f"/api/jobs/{child_id}").json()
    assert child["parent_id"] == stopped["id"]
    points = until(
        lambda: [p for p in server.all(child["id"], "metrics") if p.get("step") is not None],
        f"the first points of job {child['id']}",
        timeout=RUN_DEADLINE,
    )
    assert points[0]["step"] == last + 1, points[:3]
    return child


def test_a_time_limit_warning_saves_a_checkpoint_and_the_run_resumes(slurm_cluster, slurm_server, assets):
    """A time limit brought near once the run trains (scontrol update, so a slow machine's model load is
    never cut short), with the server's 150 s warning: Slurm sends the runner SIGUSR1 (`--signal`), the
    trainer stops after a step with a checkpoint, the job fails naming the time limit and a new attempt,
    submitted by the server through sbatch, continues from the next step. That attempt is preempted by a
    job of the `urgent` partition: warned the same way, it stops with a checkpoint, fails naming the
    preemption, and the third attempt waits for Slurm while the urgent job holds the nodes, then
    continues from the step after; cancelled, nothing of any attempt is left."""
    config = demo_config(assets, max_steps=10**4, save_steps=10**4, eval_steps=10**4, logging_steps=1)
    first = slurm_server.submit({"name": "limited", "config": config, "gpus": 1, "slurm": {"time": "60"}})
    script = until(  # written when the scheduler's pass hands the job to sbatch, not at the submit
        lambda: slurm_server.api.get(f"/api/jobs/{first['id']}/config").json()["batch_script"],
        "the batch script the job was submitted with",
    )
    assert "#SBATCH --signal=USR1@150" in script and "#SBATCH --time=60" in script, script
    until(lambda: slurm_server.all(first["id"], "metrics"), "the first attempt's first points", timeout=600)
    # The limit 3-4 minutes ahead of what it has run: inside the warning's 150 s (Slurm looks about
    # twice a minute) within a minute or two, and never before the end it warns of.
    sid = slurm_id(first)
    elapsed = seconds(slurm_cluster.run("squeue", "-h", "-j", sid, "-o", "%M").strip()) or 0
    slurm_cluster.run("scontrol", "update", f"JobId={sid}", f"TimeLimit={(elapsed + 180) // 60 + 1}")
    stopped = slurm_server.wait(first["id"], ENDED, timeout=600)
    assert stopped["status"] == "failed", stopped
    assert stopped["error"].startswith("stopped for its allocation's time limit"), stopped["error"]
    child = continued(slurm_server, stopped)

    # A job of a higher partition tier wants both nodes: Slurm preempts the attempt, warning it first.
    urgent = slurm_cluster.run(
        *("sbatch", "--parsable", "-p", "urgent", "-N", "2", "--exclusive", "--gres=gpu:1"),
        *("-o", "/dev/null", "--wrap", "sleep 20"),
    ).strip()
    preempted = slurm_server.wait(child["id"], ENDED, timeout=RUN_DEADLINE)
    assert preempted["status"] == "failed", preempted

    def told() -> dict | None:
        job = slurm_server.api.get(f"/api/jobs/{child['id']}").json()
        return job if job["error"].startswith("preempted by Slurm at ") else None

    preempted = until(told, "the preemption named as the attempt's cause")
    assert "partition tdk" in preempted["error"] and "saving a checkpoint" in preempted["error"], preempted
    grandchild = continued(slurm_server, preempted)
    assert slurm_cluster.run("squeue", "-h", "-j", urgent, "-t", "all", "-o", "%T").strip() == "COMPLETED"
    assert slurm_server.api.post(f"/api/jobs/{grandchild['id']}/cancel").status_code == 200
    ended = slurm_server.wait(grandchild["id"], ENDED, timeout=RUN_DEADLINE)
    assert ended["status"] == "cancelled", ended
    assert until(
        lambda: not left(stopped) and not left(preempted) and not left(ended),
        "no process of any attempt left",
    )


def test_a_slurmd_killed_mid_job_fails_the_job_naming_the_node(slurm_cluster, slurm_server, assets):
    """Last in this module: it takes a node away. n2's slurmd killed -9 while a 2-node job trains: Slurm
    marks n2 DOWN after SlurmdTimeout and ends the job NODE_FAIL, and the job fails naming n2 and Slurm's
    reason (not only as a stop from outside, which is all rank 0's runner sees of it). Nothing of the job
    is left on n1, rank 1 on n2 ends by itself, and n2's slurmd, restarted as the cluster started it,
    brings the node back with nothing of the job there."""
    created = slurm_server.submit(
        {
            "name": "node lost",
            "config": demo_config(assets, max_steps=2000, save_steps=1000, eval_steps=1000),
            "gpus": 1,
            "nodes": 2,
        }
    )
    slurm_server.wait(created["id"], ("running",), timeout=RUN_DEADLINE)
    until(lambda: slurm_server.all(created["id"], "metrics"), "the job's first points", timeout=RUN_DEADLINE)
    run_dir = Path(created["run_dir"])
    ranks = [
        json.loads((run_dir / name).read_text())["node"] for name in ("runner.json", "runner.rank1.json")
    ]
    assert ranks == ["n1", "n2"], ranks  # rank 0 on the allocation's first node
    sid = slurm_id(created)
    slurmd = int((slurm_cluster.root / "slurmd-n2.pid").read_text().split()[0])
    os.kill(slurmd, signal.SIGKILL)
    try:
        job = slurm_server.wait(created["id"], ENDED, timeout=RUN_DEADLINE)
        assert job["status"] == "failed", job

        def explained() -> str | None:  # rank 0's runner may report first: its error is then amended
            said = slurm_server.api.get(f"/api/jobs/{job['id']}").json()["error"]
            return said if said.startswith("node n2 (") else None

        said = until(explained, "the job's error naming n2", timeout=120)
        assert "DOWN" in said and f"failed: Slurm job {sid} ended NODE_FAIL (NodeDown)" in said, said
        assert until(lambda: not job_processes(job["run_dir"]), "nothing of rank 0 left on n1", timeout=120)
        # n2's slurmstepd outlives its slurmd and nothing reaches it; rank 1's trainer loses rank 0's
        # collectives, and its runner leaves.
        rank1 = f"{job['run_dir']}#rank1"
        assert until(lambda: not job_processes(rank1), "nothing of rank 1 left on n2", timeout=120)
    finally:
        subprocess.run(
            ["slurmd", "-f", str(slurm_cluster.conf), "-N", "n2"], env=slurm_cluster.env, check=True
        )

        def back() -> bool:
            if slurm_cluster.states().get("n2") == "down":  # registered, yet not returned (ReturnToService=2)
                slurm_cluster.run("scontrol", "update", "nodename=n2", "state=resume")
            return slurm_cluster.states().get("n2") == "idle"

        until(back, "n2 idle again", timeout=120)
    assert until(lambda: not left(job), "no process of the job left on either node", timeout=120)
    assert slurm_cluster.run("squeue", "-h", "-j", sid, "-t", "all", "-o", "%T").strip() in ("", "NODE_FAIL")
