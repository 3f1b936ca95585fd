"""The nodes page of a simulated cluster: Ray's own Cluster on this machine with N nodes of logical
resources only (no CPUs to schedule on, 8 GPUs each), a real server with the ray executor, and
headless Chromium on /nodes. Prints the time Ray took to start the nodes, the first `/api/nodes`
(it places one sampler actor per node), how long until every sampler answers, the later requests
(median / p95) and the page's render
(load to every node's card drawn). Then the placement the ray executor asks for (tunedeck.planning.placement:
one bundle per node, STRICT_SPREAD across nodes) on the same cluster: a job mix that fills every GPU
exactly, one more job that must wait, and that it is placed once a finished job's group is removed.

    .venv/bin/python bench/ray_nodes.py [--nodes 16] [--reads 30] [--renders 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from _common import ARGS, CHROMIUM, Server, assets, pct, summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--reads", type=int, default=30)
    ap.add_argument("--renders", type=int, default=5)
    args = ap.parse_args()

    from ray.cluster_utils import Cluster

    store = 80 * 1024 * 1024
    t0 = time.monotonic()
    c = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": False, "object_store_memory": store},
    )
    server = None
    try:
        for _ in range(args.nodes):
            c.add_node(num_cpus=8, num_gpus=8, object_store_memory=store)  # logical: nothing runs
        c.wait_for_nodes()
        started = time.monotonic() - t0
        print(f"cluster: head + {args.nodes} nodes (8 logical CPUs and GPUs each) up in {started:.1f} s")

        work = Path(tempfile.mkdtemp(prefix="ray-nodes-"))
        server = Server(
            work / "ws", assets(), TUNEDECK_EXECUTOR="ray", TUNEDECK_RAY_ADDRESS=c.address
        ).start()
        t = time.monotonic()
        first = server.api.get("/api/nodes", timeout=600)
        first.raise_for_status()
        first_s = time.monotonic() - t
        nodes = first.json()
        print(
            f"first /api/nodes (starts {len(nodes)} sampler actors): {first_s * 1000:.0f} ms, "
            f"{sum(n['alive'] for n in nodes)} alive, "
            f"{sum(n['gpu_slots'] or 0 for n in nodes)} logical GPUs"
        )
        t, deadline = time.monotonic(), time.monotonic() + 600
        while any("not answered" in (n["reason"] or "") for n in nodes) and time.monotonic() < deadline:
            time.sleep(0.5)  # sampler actors still starting (a worker process each)
            nodes = server.api.get("/api/nodes", timeout=600).json()
        print(f"every sampler answering {time.monotonic() - t + first_s:.1f} s after the first request")
        reads = []
        for _ in range(args.reads):
            t = time.monotonic()
            r = server.api.get("/api/nodes", timeout=600)
            r.raise_for_status()
            reads.append((time.monotonic() - t) * 1000)
        print(f"/api/nodes after that: {summary(reads)}")

        from playwright.sync_api import sync_playwright

        renders = []
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            # bypass_csp: wait_for_function evaluates a string, which the pages' policy forbids
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, bypass_csp=True)
            for _ in range(args.renders):
                t = time.monotonic()
                page.goto(f"{server.url}/nodes")
                page.wait_for_function(f"document.querySelectorAll('#nodes .card').length === {len(nodes)}")
                renders.append((time.monotonic() - t) * 1000)
            browser.close()
        print(f"/nodes page, load to {len(nodes)} cards drawn: {summary(renders)}")
        print(
            f"summary: nodes={len(nodes)} api_median_ms={statistics.median(reads):.0f} "
            f"api_p95_ms={pct(reads, 95):.0f} render_median_ms={statistics.median(renders):.0f} "
            f"loadavg={' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        placements(c.address, args.nodes)
    finally:
        if server is not None:
            server.stop()
        c.shutdown()


def placements(address: str, nodes: int) -> None:
    """Groups as the ray executor makes them, filling the cluster: every one placed whole, the next
    one pending until a group is removed."""
    import ray
    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    from tunedeck.planning import placement

    ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        # (GPUs per node, nodes) x count, biggest first: with 16 nodes of 8, 64 + 32 + 32 = all 128 GPUs.
        mix = [((8, 2), nodes // 4), ((8, 1), nodes // 4), ((4, 4), nodes // 8)]
        groups, waits = [], []
        for (gpus, n), count in mix:
            for _ in range(count):
                t = time.monotonic()
                pg = placement_group(placement.bundles(gpus, n), strategy=placement.strategy(n))
                assert pg.wait(120), f"a {n}-node job of {gpus} GPUs each was not placed"
                waits.append((time.monotonic() - t) * 1000)
                groups.append((pg, gpus * n))
        held = sum(g for _, g in groups)
        spread = all(
            len(set(placement_group_table(pg)["bundles_to_node_id"].values())) == len(pg.bundle_specs)
            for pg, _ in groups
            if len(pg.bundle_specs) > 1
        )
        print(
            f"placement: {len(groups)} jobs hold {held} GPUs on {nodes} nodes, every multi-node job on "
            f"nodes of its own: {spread}; placing each: {summary(waits)}"
        )
        extra = placement_group(placement.bundles(1, 1), strategy="PACK")
        waiting = not extra.wait(5)
        remove_placement_group(groups[0][0])
        t = time.monotonic()
        placed = extra.wait(120)
        print(
            f"one more 1-GPU job while full: waiting={waiting}; placed {placed} "
            f"{(time.monotonic() - t) * 1000:.0f} ms after a finished job's group was removed"
        )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
