"""Jobs on a two-node Ray cluster: placement, the queue, multi-node ZeRO-3, restart, cancel, a lost node;
no runner token in what Ray shows or logs.

Real LLaMA-Factory runs of the tiny model; the scenarios share runs where they can (the suite's time).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from contextlib import closing
from pathlib import Path

import psutil
import pytest

from tests.utils.servers import demo_config, job_processes, zero3
from tests.utils.wait import RUN_DEADLINE, until
from tunedeck.contract.stacks import COLLECTIVES
from tunedeck.store.hashes import token_hash

ray_state = pytest.importorskip("ray.util.state")
# Real multi-stage runs: their own waits (each with an account of the job) end them, not the suite-wide 600 s.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
ENDED = ("succeeded", "failed", "cancelled")


def placed(job: dict) -> list[dict]:
    """Where each rank ran, as the executor wrote it in the run folder."""
    path = Path(job["run_dir"]) / "placement.json"
    return until(lambda: path.exists() and json.loads(path.read_text()), f"placement of job {job['id']}")


def keys(job: dict) -> list[str]:
    """Every rank's job key (procs.JOB_KEY_ENV): rank 0 the run folder, rank r its own."""
    return [job["run_dir"]] + [f"{job['run_dir']}#rank{r}" for r in range(1, job["nodes"])]


def left(job: dict) -> list:
    return [p for k in keys(job) for p in job_processes(k)]


TOKENISH = re.compile(r"[A-Za-z0-9_-]{43,}")  # runs of secrets.token_urlsafe(32)'s alphabet and length


def tokens_in(text: str, hashes: set[str]) -> set[str]:
    """Every 43 characters of `text` whose SHA-256 is one of `hashes`: a token found from its hash."""
    return {
        run[i : i + 43]
        for run in TOKENISH.findall(text)
        for i in range(len(run) - 42)
        if token_hash(run[i : i + 43]) in hashes
    }


def token_hashes(server, job: dict) -> set[str]:
    """What the server keeps of the running job's runner tokens."""
    with closing(sqlite3.connect(server.workspace / "tunedeck.db", timeout=60)) as db:
        (stored,) = db.execute("SELECT runner_token_hash FROM jobs WHERE id = ?", (job["id"],)).fetchone()
    return set(stored.split())


def what_ray_shows(cluster) -> str:
    """Ray's state API as its dashboard serves it, every listing in detail, as one text."""
    address = f"http://{cluster.head_node.webui_url}"
    listings = (
        ray_state.list_actors,
        ray_state.list_tasks,
        ray_state.list_objects,
        ray_state.list_workers,
        ray_state.list_placement_groups,
        ray_state.list_jobs,
    )
    return json.dumps(
        [f(address=address, detail=True, limit=10000, raise_on_missing_output=False) for f in listings],
        default=lambda o: getattr(o, "__dict__", None) or str(o),
    )


def ray_logs(cluster) -> str:
    """Every file under the session's logs folder (every node's, on this one machine), as text."""
    logs = Path(cluster.head_node.get_session_dir_path()) / "logs"
    return "\n".join(p.read_bytes().decode("latin-1") for p in sorted(logs.rglob("*")) if p.is_file())


def test_tokens_are_found_from_their_hashes():
    made = ["A" * 43, "x-_9" * 10 + "end"]
    text = f"[{made[0]}] ..{made[1]}.. {'B' * 60}"
    assert tokens_in(text, {token_hash(t) for t in made}) == set(made)


def test_a_job_that_can_never_fit_is_refused_naming_the_largest_node(ray_server, assets):
    config = demo_config(assets, max_steps=2)
    r = ray_server.api.post("/api/jobs", json={"name": "too wide", "config": config, "gpus": 2})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["gpus"] and "the largest node" in err["msg"] and "has 1" in err["msg"], err
    r = ray_server.api.post("/api/jobs", json={"name": "too many", "config": config, "gpus": 1, "nodes": 3})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["nodes"] and "has 2 such node(s)" in err["msg"] and "largest node" in err["msg"], (
        err
    )


def first_point(server, job: dict, after: int = 0) -> list[dict]:
    return until(
        lambda: len(pts := server.all(job["id"], "metrics")) > after and pts,
        f"metric points of job {job['id']} beyond {after}",
        timeout=RUN_DEADLINE,
        explain=lambda: server.explain(job["id"]),
    )


def assert_points_are_rank0s(server, job: dict) -> None:
    """The stored points are exactly rank 0's trainer_log.jsonl lines, once each."""
    points = server.all(job["id"], "metrics")
    lines = [json.loads(x) for x in (Path(job["output_dir"]) / "trainer_log.jsonl").read_text().splitlines()]
    assert points and [p["step"] for p in points] == [x["current_steps"] for x in lines]
    assert [p["loss"] for p in points] == [x.get("loss") for x in lines]


def test_placement_queue_zero3_across_nodes_restart_and_cancel(ray_cluster, ray_server, assets):
    """Two 1-node jobs land on different nodes; a 2-node ZeRO-3 job waits for both, then trains
    across the nodes through a server kill -9 and restart, and a cancel stops both nodes gracefully.
    No runner token is ever in what Ray shows (its state API, the dashboard's) or logs."""
    first = ray_server.submit({"name": "one", "config": demo_config(assets, max_steps=6), "gpus": 1})
    second = ray_server.submit({"name": "two", "config": demo_config(assets, max_steps=6), "gpus": 1})
    wide = ray_server.submit(
        {
            "name": "wide",
            "config": demo_config(assets, max_steps=2000, save_steps=1000, eval_steps=1000),
            "deepspeed": zero3(),
            "gpus": 1,
            "nodes": 2,
        }
    )
    a, b = placed(first), placed(second)
    assert a[0]["node_id"] != b[0]["node_id"]  # the second 1-GPU job runs on the other node

    def waiting() -> dict | None:  # its reason comes with the scheduler's next plan, not at the submit
        job = ray_server.api.get(f"/api/jobs/{wide['id']}").json()
        return job if job["status"] != "queued" or job["waiting_for"] else None

    queued = until(waiting, "the wide job's reason to wait", timeout=RUN_DEADLINE)
    assert queued["status"] == "queued" and "Ray cluster" in queued["waiting_for"], queued
    for job in (first, second):
        done = ray_server.wait(job["id"], ENDED, timeout=RUN_DEADLINE)
        assert done["status"] == "succeeded", done
        assert (Path(done["output_dir"]) / "adapter_model.safetensors").exists()
        assert_points_are_rank0s(ray_server, done)

    seen = len(first_point(ray_server, wide))
    ranks = placed(wide)
    assert len({r["node_id"] for r in ranks}) == 2 and all(r["gpu_ids"] == [0] for r in ranks)
    # Each rank's actor made its runner's token: the server holds only their hashes, Ray's state
    # (what its dashboard shows) no token, though it lists every call of the launch.
    hashes = token_hashes(ray_server, wide)
    assert len(hashes) == 2, hashes
    shown = what_ray_shows(ray_cluster)
    assert all(f"tunedeck-job-{wide['id']}-rank{r}" in shown for r in (0, 1)) and "JobNode.start" in shown
    assert not tokens_in(shown, hashes)
    ray_server.kill()  # the actors are detached: training goes on without the server
    ray_server.start()
    first_point(ray_server, wide, after=seen)  # reattached: the runner's batches arrive again
    assert ray_server.api.get(f"/api/jobs/{wide['id']}").json()["status"] == "running"

    assert ray_server.api.post(f"/api/jobs/{wide['id']}/cancel").status_code == 200
    job = ray_server.wait(wide["id"], ENDED, timeout=RUN_DEADLINE)
    assert job["status"] == "cancelled" and job["exit_code"] == 0, job  # stopped after a step
    assert (Path(job["output_dir"]) / "adapter_model.safetensors").exists()
    assert_points_are_rank0s(ray_server, job)  # nothing lost across the restart
    # Each node's runner sampled its own memory: one series per node, named apart though one host runs both.
    devices = ray_server.api.get(f"/api/jobs/{wide['id']}/memory").json()["gpus"]
    assert len({d["node"] for d in devices}) == 2 and all(d["node"] for d in devices), devices
    logs = " ".join(g["text"] for g in ray_server.all(job["id"], "logs"))
    assert "[rank 1]" in logs and "SIGABRT" in logs
    assert until(lambda: not left(job), "no process of the job left", timeout=120)
    # Nor did Ray log any of the tokens, on any node, from start to end.
    logged = ray_logs(ray_cluster)
    assert "JobNode" in logged and not tokens_in(what_ray_shows(ray_cluster) + logged, hashes)


def rank_workers(job: dict, rank: int) -> list:
    """The trainer processes of torchrun's global rank `rank`, on whichever node it runs."""
    from tunedeck.procs import job_processes as find  # now, not after the settle `left` waits for

    out = []
    for p in (p for k in keys(job) for p in find(k)):
        try:
            if p.environ().get("RANK") == str(rank):
                out.append(p)
        except psutil.Error:
            continue
    return out


def test_a_hung_rank_is_dumped_on_every_node_and_the_summary_says_where_each_waits(ray_server, assets):
    """A real 2-node run, one rank stopped (SIGSTOP) mid-training: the other waits for it in a
    collective. A dump asked of the job comes from both nodes' runners (py-spy), rank by rank."""
    created = ray_server.submit(
        {
            "name": "hung",
            "config": demo_config(assets, max_steps=50000, save_steps=100000),  # cancelled when seen
            "gpus": 1,
            "nodes": 2,
        }
    )
    seen: list[str] = []  # rank 0's places, dump by dump: the account of a failure

    def dump() -> dict:
        """Ask the job for a dump and wait for both ranks' parts of it."""
        r = ray_server.api.post(f"/api/jobs/{created['id']}/stacks")
        assert r.status_code == 202, r.text
        asked = r.json()["request"]

        def both():
            got = ray_server.api.get(f"/api/jobs/{created['id']}/stacks", params={"request": asked}).json()
            return got if {x["rank"] for x in got["ranks"]} == {0, 1} else None

        return until(
            both, "both ranks' dumps", timeout=RUN_DEADLINE, explain=lambda: ray_server.explain(created["id"])
        )

    def waits_in_a_collective(got: dict) -> bool:
        """Rank 0 trains on until a collective its stopped peer never joins (the gradients' all-reduce
        in the backward pass, the loss's gather at a logging step, ...), and waits there."""
        where = next(x["where"] for x in got["ranks"] if x["rank"] == 0)
        seen.append(where)
        return where.startswith("the backward pass") or bool(COLLECTIVES.match(where.split(" ")[0]))

    stopped = None
    try:
        first_point(ray_server, created)
        (stopped,) = until(lambda: rank_workers(created, 1), "rank 1's trainer process")
        os.kill(stopped.pid, signal.SIGSTOP)
        got = dump()
        assert len(got["nodes"]) == 2 and {n["runner_rank"] for n in got["nodes"]} == {0, 1}, got["nodes"]
        by_rank = {x["rank"]: x for x in got["ranks"]}
        assert by_rank[1]["pid"] == stopped.pid and not by_rank[1]["where"].startswith("not dumped"), got
        until(
            lambda: waits_in_a_collective(dump()),
            "rank 0 waiting for rank 1",
            timeout=600,
            interval=5.0,
            explain=lambda: f"rank 0 was seen in: {seen[-8:]}",
        )
    finally:
        if stopped is not None:
            os.kill(stopped.pid, signal.SIGCONT)
        # Always, so that a failure here leaves the shared cluster's nodes free for the next test.
        ray_server.api.post(f"/api/jobs/{created['id']}/cancel")
        job = ray_server.wait(created["id"], ENDED, timeout=RUN_DEADLINE)
    assert job["status"] == "cancelled", job
    assert until(lambda: not left(job), "no process of the job left on either node", timeout=120)


def test_a_lost_node_fails_the_job_naming_it_and_ends_the_other_node(ray_cluster, ray_server, assets):
    """Last in this module: it takes a node away from the shared cluster."""
    created = ray_server.submit(
        {
            "name": "lost",
            "config": demo_config(assets, max_steps=2000, save_steps=1000),
            "gpus": 1,
            "nodes": 2,
        }
    )
    first_point(ray_server, created)
    rank1 = placed(created)[1]
    (node,) = [n for n in ray_cluster.list_all_nodes() if n.node_id == rank1["node_id"]]
    ray_cluster.remove_node(node, allow_graceful=False)  # its raylet and workers are killed
    job = ray_server.wait(created["id"], ENDED, timeout=RUN_DEADLINE)
    assert job["status"] == "failed", job
    assert f"node {rank1['host']} ({rank1['ip']}, node {rank1['node_id'][:8]}) lost" in job["error"], job
    assert until(lambda: not left(job), "no process of the job left on either node", timeout=120)
