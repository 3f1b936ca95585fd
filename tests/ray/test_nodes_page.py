"""The nodes page on a Ray cluster: a head and two nodes on this machine (Ray's own Cluster), a real
server with the ray executor. Ray lists the nodes, a sampler actor on each reads its GPUs (one node's
through the NVML stand-in), and a node removed from the cluster shows dead."""

from __future__ import annotations

import json
import os
import sqlite3
from contextlib import closing

import pytest

from tests.ray.conftest import head_ports
from tests.utils.browser import shot
from tests.utils.servers import ROOT, demo_config
from tests.utils.wait import until

ray_cluster_utils = pytest.importorskip("ray.cluster_utils", reason="Ray is the `ray` extra")

GIB = 1 << 30
STORE = 80 * 1024 * 1024  # object store per node: the smallest Ray accepts, plenty for readings
GPUS = [
    {"name": "Stand-in H100", "bdf": "0000:11:00.0", "total": 80 * GIB, "vram": [3 * GIB], "activity": 40},
    {"name": "Stand-in H100", "bdf": "0000:12:00.0", "total": 80 * GIB, "vram": [70 * GIB], "activity": 95},
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head (no CPUs: nothing is placed there) plus node A, whose processes see scripted GPUs, and node B."""
    trace = tmp_path_factory.mktemp("smi") / "trace.json"
    trace.write_text(json.dumps({"devices": GPUS}))
    # Node A's raylet, and so its workers, find the NVML stand-in first on their path.
    path = os.pathsep.join([str(ROOT / "tests" / "fakes" / "nvml"), str(ROOT / "backend")])
    c = ray_cluster_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "object_store_memory": STORE,
            **head_ports(),
        },
    )
    try:
        a = c.add_node(
            num_cpus=1,
            num_gpus=1,
            object_store_memory=STORE,
            env_vars={"PYTHONPATH": path, "TUNEDECK_FAKE_SMI_TRACE": str(trace)},
        )
        b = c.add_node(num_cpus=1, num_gpus=1, object_store_memory=STORE)
        c.wait_for_nodes()
        yield c, a, b
    finally:
        c.shutdown()


def test_nodes_of_the_cluster_alive_then_one_dead(cluster, server_factory, assets, tmp_path, page):
    c, a, b = cluster
    standin = tmp_path / "runner.sh"  # a job's runner that just stays: the job holds a GPU meanwhile
    standin.write_text("#!/bin/sh\nexec sleep 3600\n")
    standin.chmod(0o755)
    server = server_factory(
        TUNEDECK_EXECUTOR="ray",
        TUNEDECK_RAY_ADDRESS=c.address,
        TUNEDECK_TRAIN_PYTHON=str(standin),
        TUNEDECK_GPU_SLOTS="0",
        TUNEDECK_CPU_SLOTS="1",
    )
    job = server.submit({"name": "placed", "config": demo_config(assets), "gpus": 0})["id"]
    server.wait(job, ("running",))

    def recorded():
        with closing(sqlite3.connect(server.workspace / "tunedeck.db", timeout=60)) as db:
            return db.execute("SELECT placement FROM jobs WHERE id = ?", (job,)).fetchone()[0]

    # The ray executor records where the job runs once its actors started (this CPU job holds no
    # GPU there). Moved by hand to GPU 1 of node A, whose stand-in GPUs the page reads.
    placed = json.loads(until(recorded, "the job's placement recorded"))
    assert len(placed) == 1 and placed[0]["node"] in {a.node_id, b.node_id}, placed
    with closing(sqlite3.connect(server.workspace / "tunedeck.db", timeout=60)) as db, db:
        placement = json.dumps([{"node": a.node_id, "devices": [1]}])
        db.execute("UPDATE jobs SET placement = ? WHERE id = ?", (placement, job))

    def listed() -> dict:
        r = server.api.get("/api/nodes")
        assert r.status_code == 200, r.text
        return {n["id"]: n for n in r.json()}

    ids = {c.head_node.node_id, a.node_id, b.node_id}
    nodes = until(
        lambda: (n := listed()).keys() == ids and all(x["alive"] for x in n.values()) and n, "3 nodes"
    )
    assert nodes[c.head_node.node_id]["head"] and not nodes[a.node_id]["head"]
    assert nodes[a.node_id]["gpu_slots"] == 1 == nodes[b.node_id]["gpu_slots"]
    node_a = until(lambda: (n := listed()[a.node_id])["gpus"] and n, "node A's GPU readings")
    assert node_a["backend"] == "nvidia" and node_a["reason"] is None
    assert [(g["index"], g["name"], g["total_bytes"], g["used_bytes"]) for g in node_a["gpus"]] == [
        (0, "Stand-in H100", 80 * GIB, 3 * GIB),
        (1, "Stand-in H100", 80 * GIB, 70 * GIB),
    ]
    assert [g["job_id"] for g in node_a["gpus"]] == [None, job]
    # Node B's first reading may come later than node A's on a loaded machine: until then "unknown".
    node_b = until(lambda: (n := listed()[b.node_id])["backend"] != "unknown" and n, "node B's reading")
    assert (
        node_b["backend"] == "cpu" and node_b["gpus"] == [] and node_b["reason"]
    )  # says why: no GPU library

    c.remove_node(b)
    gone = until(lambda: (n := listed())[b.node_id]["alive"] is False and n, "node B dead")
    assert gone[b.node_id]["gpus"] == [] and "dead" in gone[b.node_id]["reason"]
    assert gone[a.node_id]["alive"] and gone[a.node_id]["gpus"]

    page.goto(f"{server.url}/nodes")
    cards = page.locator("#nodes .card")
    until(lambda: cards.count() == 3, "three node cards")
    dead = page.locator('#nodes .card[data-alive="0"]')
    assert dead.count() == 1 and dead.get_attribute("data-node") == b.node_id
    assert "dead" in dead.locator("h2").inner_text()
    assert "Stand-in H100" in page.locator(f'#nodes .card[data-node="{a.node_id}"]').inner_text()
    assert page.locator("#recent-what").is_visible()  # the Recent-problems card is kept
    shot(page, "nodes-ray-cluster")
    assert page.errors == []
