"""Placement without Ray: what can never fit a cluster, the queue's order when an executor places jobs
itself, the per-rank file names, a runner that dies with the actor that started it, and the local
executor's answer to a multi-node job."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timedelta, timezone

from tests.utils.servers import demo_config
from tests.utils.wait import until
from tunedeck import procs
from tunedeck.contract import runfiles
from tunedeck.planning.placement import ClusterNode, bundles, order, refusal, strategy
from tunedeck.planning.queueplan import STARTING
from tunedeck.store.tables import Job

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)
CLUSTER = [
    ClusterNode(name="head", ip="10.0.0.1", gpus=0, cpus=0),
    ClusterNode(name="gpu-a", ip="10.0.0.2", gpus=8, cpus=64),
    ClusterNode(name="gpu-b", ip="10.0.0.3", gpus=4, cpus=64),
    ClusterNode(name="gpu-c", ip="10.0.0.4", gpus=8, cpus=64, alive=False),
]


def job(id: int, *, gpus: int = 1, nodes: int = 1, created: datetime = NOW, priority: int = 0) -> Job:
    spec = json.dumps({"name": f"j{id}", "config": {}, "priority": priority})
    return Job(id=id, name=f"j{id}", gpus=gpus, nodes=nodes, spec=spec, train_yaml="", created_at=created)


def test_a_job_that_can_never_fit_names_the_largest_live_node():
    (err,) = refusal(9, 1, CLUSTER)
    assert err["loc"] == ["gpus"] and "gpu-a (10.0.0.2), has 8" in err["msg"]
    (err,) = refusal(8, 2, CLUSTER)  # gpu-c has 8 too, but it is dead
    assert err["loc"] == ["nodes"] and "has 1 such node(s)" in err["msg"] and "gpu-a" in err["msg"]
    assert refusal(4, 2, CLUSTER) == []
    assert refusal(0, 3, CLUSTER)[0]["loc"] == ["nodes"]  # the head has no CPU to give
    assert (
        refusal(1, 1, [n for n in CLUSTER if n.name == "gpu-c"])[0]["msg"]
        == "the Ray cluster has no live node"
    )


def test_bundles_and_strategy():
    assert bundles(2, 3) == [{"GPU": 2.0, "CPU": 1.0}] * 3
    assert bundles(0, 1) == [{"CPU": 1.0}]
    assert (strategy(1), strategy(2)) == ("PACK", "STRICT_SPREAD")


class Cluster:
    """Stands in for the executor's place/release: `free` jobs can be placed, the rest wait."""

    def __init__(self, free: set[int]):
        self.free, self.placed, self.released = free, [], []

    def place(self, j: Job) -> bool:
        self.placed.append(j.id)
        return j.id in self.free

    def release(self, j: Job) -> None:
        self.released.append(j.id)


def test_the_queue_keeps_priority_and_backfill_when_the_executor_places():
    c = Cluster(free={3, 4})
    queued = [job(1, nodes=2), job(2, priority=0), job(3, priority=5), job(4), job(5)]
    starts, spots = order(queued, place=c.place, release=c.release, backfill_max_wait_s=1800, now=NOW)
    # 3 (priority 5) first; 1 waits for its two nodes; 4 fits meanwhile (same priority, 1 is young).
    assert [j.id for j in starts] == [3, 4]
    assert spots[3].waiting_for == STARTING and spots[3].position == 1
    assert "2 node(s) with 1 GPU free" in spots[1].waiting_for
    assert c.released == []

    old = NOW - timedelta(hours=1)  # 1 has waited out its window: nothing behind it is placed any more
    c = Cluster(free={4})
    queued = [job(1, nodes=2, created=old), job(4)]
    starts, spots = order(queued, place=c.place, release=c.release, backfill_max_wait_s=1800, now=NOW)
    assert starts == [] and c.placed == [1] and c.released == [4]
    assert spots[4].waiting_for == "behind job 1 (queued earlier)"

    c = Cluster(free={2})  # a waiting job of higher priority holds every lower one
    queued = [job(1, priority=3), job(2, priority=1)]
    starts, spots = order(queued, place=c.place, release=c.release, backfill_max_wait_s=1800, now=NOW)
    assert starts == [] and spots[2].waiting_for == "behind job 1 (higher priority)" and c.released == [2]


def test_each_rank_has_files_of_its_own():
    assert runfiles.ranked(runfiles.OUTBOX, 0) == "outbox.jsonl"
    assert runfiles.ranked(runfiles.OUTBOX, 1) == "outbox.rank1.jsonl"
    assert runfiles.ranked(runfiles.RUNNER_CONFIG, 12) == "runner.rank12.json"
    assert runfiles.ranked("trainer.pid", 2) == "trainer.rank2.pid"


RUNNER = """
import os, signal, subprocess, sys, threading
from tunedeck.runner.main import watch_parent
parent = os.getppid()
trainer = subprocess.Popen([sys.executable, "-c", "import signal; signal.pause()"], start_new_session=True)
print(trainer.pid, flush=True)
watch_parent(sys.argv[1], parent, threading.Event(), every_s=0.1)
"""
ACTOR = """
import subprocess, sys
runner = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
runner.wait()
"""


def test_a_runner_dies_with_the_actor_that_started_it(tmp_path):
    """A killed actor (its raylet gone) leaves no runner and no trainer behind on its node."""
    key = str(tmp_path / "job#rank1")
    env = {**os.environ, procs.JOB_KEY_ENV: key}
    actor = subprocess.Popen(
        [sys.executable, "-c", ACTOR, RUNNER, key], env=env, stdout=subprocess.PIPE, text=True
    )
    trainer = int(actor.stdout.readline())
    until(lambda: [p for p in procs.job_processes(key) if p.pid != trainer], "the runner")
    assert procs.carries_key(trainer, key)
    os.kill(actor.pid, signal.SIGKILL)
    actor.wait()
    until(lambda: not procs.job_processes(key), "the runner and its trainer gone", timeout=60)


def test_the_local_executor_refuses_more_than_one_node(app_factory, assets):
    app = app_factory()
    r = app.api.post("/api/jobs", json={"name": "wide", "config": demo_config(assets), "gpus": 0, "nodes": 2})
    assert r.status_code == 422, r.text
    (err,) = r.json()["detail"]
    assert err["loc"] == ["nodes"] and "TUNEDECK_EXECUTOR=ray" in err["msg"]
    r = app.api.post("/api/jobs", json={"name": "one", "config": demo_config(assets), "gpus": 0})
    assert r.status_code == 201 and r.json()["nodes"] == 1, r.text
