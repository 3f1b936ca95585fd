"""Scheduling control: the queue plan on its own (priority, pinned GPUs, backfill and its wait cap),
the spec keys refused at submit, and a live server on two stand-in GPUs whose trainers report the
environment they were given."""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.utils.factories import create_token
from tests.utils.servers import demo_config
from tests.utils.standin import release, training_env
from tests.utils.wait import until
from tunedeck.checks import jobenv
from tunedeck.cli.main import app as cli_app
from tunedeck.planning.queueplan import STARTING, Capacity, plan
from tunedeck.store.tables import Job, JobStatus

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
OLD = NOW - timedelta(hours=2)  # past the default backfill_max_wait_s (30 min)


def job(id: int, *, gpus: int = 1, on: str | None = None, created: datetime = NOW, **spec) -> Job:
    """A job row: running on the devices `on`, queued without; `spec` holds priority/devices/env."""
    status = JobStatus.running if on is not None or spec.pop("running", False) else JobStatus.queued
    return Job(
        id=id,
        name=f"j{id}",
        gpus=gpus,
        status=status,
        devices=on,
        spec=json.dumps({"name": f"j{id}", "config": {}, **spec}),
        train_yaml="",
        created_at=created,
    )


def started(p) -> dict[int, list[int]]:
    return {j.id: devices for j, devices in p.starts}


def reasons(p) -> dict[int, tuple[int, str]]:
    return {i: (s.position, s.waiting_for) for i, s in p.spots.items()}


TWO = Capacity(gpus=2, cpu_slots=1)


def test_a_small_job_backfills_an_idle_gpu_while_a_big_one_waits():
    p = plan([job(1, on="0")], [job(2, gpus=2), job(3)], TWO, NOW)
    assert started(p) == {3: [1]}
    assert reasons(p) == {2: (1, "2 GPUs; 1 free (GPU 0 held by job 1)"), 3: (2, STARTING)}


def test_a_big_job_past_its_wait_keeps_every_gpu_that_frees():
    # Job 3 backfilled GPU 1 long ago; job 1 has just left GPU 0: it is kept for job 2, not given to 4.
    running = [job(3, on="1")]
    p = plan(running, [job(2, gpus=2, created=OLD), job(4, created=OLD + timedelta(minutes=1))], TWO, NOW)
    assert started(p) == {}
    assert reasons(p) == {
        2: (1, "2 GPUs; 1 free (GPU 1 held by job 3)"),
        4: (2, "behind job 2 (queued earlier)"),
    }
    # Within its window the same big job lets job 4 in.
    assert started(plan(running, [job(2, gpus=2), job(4)], TWO, NOW)) == {4: [0]}
    # Once job 3 ends, job 2 starts on both; job 4 waits for it.
    p = plan([], [job(2, gpus=2, created=OLD), job(4)], TWO, NOW)
    assert started(p) == {2: [0, 1]}
    assert reasons(p)[4] == (2, "1 GPU; 0 free (GPUs 0, 1 held by job 2)")


def test_a_zero_wait_means_nothing_overtakes_a_gpu_count():
    cap = Capacity(gpus=2, cpu_slots=1, backfill_max_wait_s=0)
    p = plan([job(1, on="0")], [job(2, gpus=2), job(3)], cap, NOW)
    assert started(p) == {}
    assert reasons(p)[3] == (2, "behind job 2 (queued earlier)")


def test_pinned_gpus_are_kept_for_their_job_and_given_last_to_others():
    p = plan([job(1, on="1")], [job(2, devices=[1]), job(3, devices=[1]), job(4)], TWO, NOW)
    assert started(p) == {4: [0]}
    assert reasons(p) == {
        2: (1, "GPU 1 (GPU 1 held by job 1)"),
        3: (2, "GPU 1 (GPU 1 held by job 1)"),
        4: (3, STARTING),
    }
    # A job ahead that has waited its window out keeps the GPU from a later job pinned to it.
    p = plan([job(4, on="0")], [job(1, gpus=2, created=OLD), job(2, devices=[1])], TWO, NOW)
    assert started(p) == {} and reasons(p)[2] == (2, "behind job 1 (queued earlier)")
    # GPU 1 frees: the first job pinned to it gets it.
    p = plan([job(4, on="0")], [job(2, devices=[1]), job(3, devices=[1])], TWO, NOW)
    assert started(p) == {2: [1]}
    # A job asking for a count takes the GPU no later job is pinned to, so both start.
    assert started(plan([], [job(6), job(7, devices=[0])], TWO, NOW)) == {6: [1], 7: [0]}


def test_priority_orders_the_queue_and_cpu_jobs_never_wait_for_gpus():
    queued = [job(2, gpus=0), job(3, gpus=0, priority=5), job(4, gpus=2, created=OLD), job(5, gpus=0)]
    p = plan([job(1, gpus=0, running=True), job(6, on="0")], queued, TWO, NOW)
    assert started(p) == {}
    assert reasons(p) == {
        3: (1, "a CPU slot (held by job 1)"),
        2: (2, "behind job 3 (higher priority)"),
        4: (3, "2 GPUs; 1 free (GPU 0 held by job 6)"),
        5: (4, "behind job 3 (higher priority)"),
    }
    p = plan([job(6, on="0")], queued, Capacity(gpus=2, cpu_slots=2), NOW)
    assert started(p) == {3: [], 2: []}
    assert reasons(p)[5] == (4, "a CPU slot (held by jobs 3, 2)")
    paused = plan([], queued, Capacity(gpus=2, cpu_slots=2, paused=True), NOW)
    assert started(paused) == {} and {s.waiting_for for s in paused.spots.values()} == {"launches paused"}


def _errors(r) -> dict[tuple, str]:
    assert r.status_code == 422, r.text
    return {tuple(e["loc"]): e["msg"] for e in r.json()["detail"]}


def test_devices_priority_and_env_are_checked_at_submit(app_factory, assets):
    app = app_factory(TUNEDECK_GPU_SLOTS="2")
    base = {"name": "s", "config": demo_config(assets)}

    def refused(**spec) -> dict[tuple, str]:
        return _errors(app.api.post("/api/jobs", json={**base, **spec}))

    assert "GPU 2 not on this node (it has GPUs 0-1)" in refused(devices=[2])[("devices",)]
    assert "twice" in refused(devices=[1, 1])[("devices",)]
    assert "conflict with gpus=2" in refused(devices=[0], gpus=2)[("devices",)]
    assert ("body", "priority") in refused(priority=11)
    errs = refused(env={"LD_PRELOAD": "x.so", "CUDA_VISIBLE_DEVICES": "1", "NCCL_NET_PLUGIN": "p"})
    assert "allowed: NCCL_*" in errs[("env", "LD_PRELOAD")]
    assert "`devices`" in errs[("env", "CUDA_VISIBLE_DEVICES")]
    assert "load or write a file" in errs[("env", "NCCL_NET_PLUGIN")]
    errs = refused(env={"NCCL_DEBUG": "INFO\nX", "HSA_ENABLE_SDMA": "0" * 2000, "OMP_NUM_THREADS": "-1"})
    assert set(errs) == {("env", "NCCL_DEBUG"), ("env", "HSA_ENABLE_SDMA"), ("env", "OMP_NUM_THREADS")}
    assert app.api.get("/api/jobs").json()["jobs"] == []

    env = {"NCCL_DEBUG": "INFO", "HSA_OVERRIDE_GFX_VERSION": "11.0.0"}
    made = app.submit({**base, "devices": [1], "priority": 3, "env": env})
    assert (made["gpus"], made["priority"], made["queue_position"]) == (1, 3, 1)
    assert made["waiting_for"] == "launches paused"
    assert app.api.get(f"/api/jobs/{made['id']}/config").json()["env"] == env
    listed = app.api.get("/api/jobs").json()["jobs"]
    assert [(j["queue_position"], j["waiting_for"]) for j in listed] == [(1, "launches paused")]


def test_the_hang_debugging_knobs_pytorch_asks_for_are_allowed_and_the_flight_recorder_dumps_in_the_run(
    app_factory, assets
):
    app = app_factory()
    base = {"name": "knobs", "config": demo_config(assets)}
    knobs = {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000",
        "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
        "TORCH_CPP_LOG_LEVEL": "INFO",
        "FI_CXI_RX_MATCH_MODE": "hybrid",
    }
    made = app.submit({**base, "env": knobs})
    assert app.api.get(f"/api/jobs/{made['id']}/config").json()["env"] == knobs
    launched = jobenv.launch(knobs)
    assert (
        launched["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == "flight_recorder_rank_"
    )  # the trainer's cwd: the run
    assert launched["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert "TORCH_NCCL_DEBUG_INFO_TEMP_FILE" not in jobenv.launch({"TORCH_NCCL_TRACE_BUFFER_SIZE": "0"})
    # The recorder's newer name (every backend, gloo too): allowed, and its dump lands in the run as well.
    assert app.submit({**base, "env": {"TORCH_FR_BUFFER_SIZE": "500"}})["id"]
    newer = jobenv.launch({"TORCH_FR_BUFFER_SIZE": "500"})
    assert (
        newer["TORCH_FR_DUMP_TEMP_FILE"]
        == newer["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"]
        == "flight_recorder_rank_"
    )
    assert "TORCH_FR_DUMP_TEMP_FILE" not in jobenv.launch({"TORCH_FR_BUFFER_SIZE": "0"})
    errs = _errors(
        app.api.post(
            "/api/jobs",
            json={
                **base,
                "env": {
                    "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/etc/x",  # names a file: the run folder's, always
                    "FI_PROVIDER_PATH": "/tmp/prov",  # loads libraries from a folder
                    "TORCH_DISTRIBUTED_DEBUG": "LOUD",
                    "TORCH_NCCL_TRACE_BUFFER_SIZE": "-5",
                    "TORCH_FR_BUFFER_SIZE": "lots",
                    "TORCH_FR_DUMP_TEMP_FILE": "/etc/y",
                },
            },
        )
    )
    assert "load or write a file" in errs[("env", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")]
    assert "load or write a file" in errs[("env", "FI_PROVIDER_PATH")]
    assert errs[("env", "TORCH_DISTRIBUTED_DEBUG")] == "must be OFF, INFO or DETAIL"
    assert "whole number of entries" in errs[("env", "TORCH_NCCL_TRACE_BUFFER_SIZE")]
    assert "whole number of entries" in errs[("env", "TORCH_FR_BUFFER_SIZE")]
    assert "not a variable a job may set" in errs[("env", "TORCH_FR_DUMP_TEMP_FILE")]


def test_a_queued_jobs_priority_changes_by_its_owner_or_an_admin(app_factory, assets):
    app = app_factory(TUNEDECK_OPEN_WRITE="false")
    alice, bob, admin = (
        {"Authorization": f"Bearer {create_token(app.engine, n, r)}"}
        for n, r in (("alice", "submitter"), ("bob", "submitter"), ("root", "admin"))
    )
    base = {"config": demo_config(assets)}

    def submit(name: str, who: dict) -> int:
        r = app.api.post("/api/jobs", json={**base, "name": name}, headers=who)
        assert r.status_code == 201, r.text
        return r.json()["id"]

    def line() -> list[int]:
        jobs = app.api.get("/api/jobs", headers=alice).json()["jobs"]
        return [j["id"] for j in sorted(jobs, key=lambda j: j["queue_position"] or 99)]

    a, b, c = submit("a", alice), submit("b", alice), submit("c", bob)
    assert line() == [a, b, c]
    r = app.api.patch(f"/api/jobs/{a}", json={"priority": 9}, headers=bob)
    assert r.status_code == 403 and "only its owner (alice)" in r.json()["detail"], r.text
    r = app.api.patch(f"/api/jobs/{b}", json={"priority": 5}, headers=alice)
    assert r.status_code == 200, r.text
    assert (r.json()["priority"], r.json()["queue_position"]) == (5, 1)
    assert line() == [b, a, c]  # the order the scheduler starts them in
    r = app.api.patch(f"/api/jobs/{c}", json={"priority": 7}, headers=admin)
    assert r.status_code == 200 and line() == [c, b, a]
    assert app.api.get(f"/api/jobs/{c}", headers=bob).json()["priority"] == 7
    r = app.api.patch(f"/api/jobs/{a}", json={"priority": 11}, headers=alice)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "priority"], r.text
    assert app.api.post(f"/api/jobs/{a}/cancel", headers=alice).json()["status"] == "cancelled"
    r = app.api.patch(f"/api/jobs/{a}", json={"priority": 3, "notes": "x"}, headers=alice)
    assert r.status_code == 409 and "only a queued job's priority" in r.json()["detail"], r.text
    got = app.api.get(f"/api/jobs/{a}", headers=alice).json()
    assert (got["priority"], got["notes"]) == (0, None)  # nothing of a refused change is kept
    assert app.api.patch(f"/api/jobs/{a}", json={"notes": "x"}, headers=alice).status_code == 200


def test_the_cli_submits_priority_devices_and_env_and_shows_them(server_factory, assets, tmp_path):
    server = server_factory(TUNEDECK_GPU_SLOTS="2", TUNEDECK_LAUNCH_PAUSED="true")
    job_yaml = tmp_path / "pinned.yaml"
    job_yaml.write_text(yaml.safe_dump(demo_config(assets)))

    def cli(*args: str):
        return CliRunner().invoke(cli_app, [*args, "--server", server.url], catch_exceptions=False)

    r = cli("submit", str(job_yaml), "--priority", "4", "--devices", "1", "--env", "NCCL_DEBUG=INFO")
    assert r.exit_code == 0, r.output
    job_id = int(r.stdout.split()[2])
    job = server.api.get(f"/api/jobs/{job_id}").json()
    assert (job["priority"], job["pinned"], job["gpus"]) == (4, [1], 1), job
    assert server.api.get(f"/api/jobs/{job_id}/config").json()["env"] == {"NCCL_DEBUG": "INFO"}
    r = cli("jobs")
    assert "gpus=1  priority=4  devices=1  pinned  (#1 in line: launches paused)" in r.stdout, r.stdout
    r = cli("priority", str(job_id), "6")
    assert r.exit_code == 0 and "priority=6" in r.stdout, r.output
    r = cli("submit", str(job_yaml), "--env", "NCCL_DEBUG")
    assert r.exit_code == 2 and "KEY=VALUE" in r.output, r.output
    r = cli("submit", str(job_yaml), "--devices", "5")
    assert r.exit_code == 1 and "devices: GPU 5 not on this node" in r.output, r.output
    r = cli("submit", str(job_yaml), "--nodes", "2")  # sent as the spec's nodes: this server has one
    assert r.exit_code == 1 and "nodes: 2 nodes need the ray executor" in r.output, r.output


# --------------------------------------------------------------------------- live, stand-in GPUs


@pytest.fixture(scope="module")
def gpu_node(tmp_path_factory, assets):
    from tests.utils.servers import Server
    from tunedeck.procs import kill_job

    root = tmp_path_factory.mktemp("sched")
    server = Server(
        root / "ws",
        assets,
        TUNEDECK_GPU_SLOTS="2",
        TUNEDECK_CPU_SLOTS="2",
        TUNEDECK_TRAIN_PYTHON=str(training_env(root / "env")),
    ).start()
    yield server
    server.stop()
    for run_dir in (root / "ws" / "runs").iterdir():
        kill_job(str(run_dir))


class Node:
    def __init__(self, server, assets):
        self.server, self.config = server, demo_config(assets)

    def submit(self, name: str, **spec) -> int:
        return self.server.submit({"name": f"held-{name}", "config": self.config, **spec})["id"]

    def get(self, job_id: int) -> dict:
        return self.server.api.get(f"/api/jobs/{job_id}").json()

    def running(self, job_id: int) -> dict:
        return until(lambda: (j := self.get(job_id))["status"] == "running" and j, f"job {job_id} running")

    def trainer_env(self, job_id: int) -> dict:
        path = Path(self.get(job_id)["run_dir"]) / "trainer-env.json"
        return json.loads(until(lambda: path.exists() and path.read_text(), f"job {job_id}'s trainer env"))

    def release(self, job_id: int) -> None:
        self.running(job_id)
        release(Path(self.get(job_id)["run_dir"]))
        self.server.wait(job_id, ("succeeded",), timeout=120)


def test_cpu_jobs_get_their_share_of_cores_and_start_by_priority(gpu_node, assets):
    node = Node(gpu_node, assets)
    c1 = node.submit("c1", gpus=0)
    c2 = node.submit("c2", gpus=0, env={"OMP_NUM_THREADS": "3"})
    cores = len(os.sched_getaffinity(0))
    assert node.trainer_env(c1)["OMP_NUM_THREADS"] == str(max(1, cores // 2))
    assert node.trainer_env(c2)["OMP_NUM_THREADS"] == "3"  # the job's own wins
    low = node.submit("low", gpus=0)
    high = node.submit("high", gpus=0, priority=4)
    assert (node.get(high)["queue_position"], node.get(low)["queue_position"]) == (1, 2)
    assert node.get(high)["waiting_for"] == f"a CPU slot (held by jobs {c1}, {c2})"
    assert node.get(low)["waiting_for"] == f"behind job {high} (higher priority)"
    node.release(c1)
    node.running(high)
    assert node.get(low)["status"] == "queued"
    for j in (c2, high, low):
        node.release(j)


def test_gpu_ids_backfill_env_and_no_starving_on_two_stand_in_gpus(gpu_node, assets):
    node = Node(gpu_node, assets)
    alloc = "expandable_segments:False"
    a = node.submit("a", gpus=1, env={"NCCL_DEBUG": "INFO", "PYTORCH_HIP_ALLOC_CONF": alloc})
    assert node.running(a)["devices"] == [0]
    env = node.trainer_env(a)
    assert (env["NCCL_DEBUG"], env["PYTORCH_HIP_ALLOC_CONF"], env["OPTIM_TORCH"]) == ("INFO", alloc, "0")
    assert (env["CUDA_VISIBLE_DEVICES"], env["HIP_VISIBLE_DEVICES"]) == ("0", "0")

    big = node.submit("big", gpus=2)
    assert (node.get(big)["queue_position"], node.get(big)["waiting_for"]) == (
        1,
        f"2 GPUs; 1 free (GPU 0 held by job {a})",
    )
    b = node.submit("b", devices=[1])  # backfills the idle GPU while the 2-GPU job waits
    assert node.running(b)["devices"] == [1]
    assert node.trainer_env(b)["CUDA_VISIBLE_DEVICES"] == "1"
    assert node.get(big)["waiting_for"] == f"2 GPUs; 0 free (GPU 0 held by job {a}; GPU 1 held by job {b})"

    # The big job has now waited past TUNEDECK_BACKFILL_MAX_WAIT_S: what frees is kept for it.
    with closing(sqlite3.connect(gpu_node.workspace / "tunedeck.db", timeout=60)) as db, db:
        db.execute("UPDATE jobs SET created_at = datetime('now', '-2 hours') WHERE id = ?", (big,))
    c = node.submit("c", gpus=1)
    node.release(a)
    # A CPU job started after GPU 0 freed proves a scheduler pass has seen it: job c was not started.
    probe = node.submit("probe", gpus=0)
    node.running(probe)
    assert node.get(c)["status"] == "queued"
    assert node.get(c)["waiting_for"] == f"behind job {big} (queued earlier)"
    node.release(b)
    assert node.running(big)["devices"] == [0, 1]
    assert node.get(c)["waiting_for"] == f"1 GPU; 0 free (GPUs 0, 1 held by job {big})"
    for j in (big, c, probe):
        node.release(j)
