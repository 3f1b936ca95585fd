"""The Ray executor's overhead on one tiny job: submit → first loss point, and tokens/s, local vs Ray.

Paired runs (local then Ray, PAIRS times) of the same CPU fine-tune: a local server, and a server on a
one-node Ray cluster (`ray.cluster_utils.Cluster`, a logical GPU) on this machine. Prints each run and
the medians, with the load average (this machine is shared: say so with the figures).

    PYTHONPATH=backend:trainer TUNEDECK_TEST_ASSETS=/work/assets python bench/ray_overhead.py [PAIRS]
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.utils.servers import Server, demo_config  # noqa: E402

STEPS = 30


def assets() -> Path:
    return Path(os.environ["TUNEDECK_TEST_ASSETS"])  # built by `python -m tunedeck_train.demo build`


def run(server: Server, gpus: int) -> tuple[float, float]:
    """Seconds from submit to the first loss point, and the median tokens/s of the run's points."""
    config = demo_config(assets(), max_steps=STEPS, logging_steps=2, eval_steps=1000, save_steps=1000)
    # One thread count for both: a Ray worker would otherwise pass its own OMP_NUM_THREADS on.
    spec = {"name": "bench", "config": config, "gpus": gpus, "env": {"OMP_NUM_THREADS": "2"}}
    t0 = time.monotonic()
    job = server.submit(spec)
    first = None
    while first is None:
        points = server.api.get(f"/api/jobs/{job['id']}/metrics").json()["points"]
        if any(p["loss"] is not None for p in points):
            first = time.monotonic() - t0
        else:
            assert time.monotonic() - t0 < 600, "no loss point in 600 s"
            time.sleep(0.1)
    done = server.wait(job["id"], ("succeeded", "failed", "cancelled"), timeout=600)
    assert done["status"] == "succeeded", done
    tps = [p["throughput"] for p in server.all(job["id"], "metrics") if p.get("throughput")]
    return first, statistics.median(tps)


def main(pairs: int) -> None:
    from ray.cluster_utils import Cluster

    store = 80 * 1024 * 1024
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "num_gpus": 0,
            "include_dashboard": False,
            "object_store_memory": store,
        },
    )
    cluster.add_node(num_cpus=2, num_gpus=1, object_store_memory=store)
    cluster.wait_for_nodes()
    root = Path(tempfile.mkdtemp(prefix="ray-bench-"))
    local = Server(root / "local", assets()).start()
    on_ray = Server(
        root / "ray", assets(), TUNEDECK_EXECUTOR="ray", TUNEDECK_RAY_ADDRESS=cluster.address
    ).start()
    rows: dict[str, list[tuple[float, float]]] = {"local": [], "ray": []}
    try:
        for i in range(pairs):
            for name, server, gpus in (("local", local, 0), ("ray", on_ray, 1)):
                first, tps = run(server, gpus)
                rows[name].append((first, tps))
                print(
                    f"pair {i + 1} {name:>5}: first loss point {first:5.1f} s, {tps:7.0f} tokens/s",
                    flush=True,
                )
    finally:
        local.stop()
        on_ray.stop()
        cluster.shutdown()
    for name, r in rows.items():
        print(
            f"{name:>5}: median first point {statistics.median(x for x, _ in r):.1f} s, "
            f"median {statistics.median(y for _, y in r):.0f} tokens/s over {len(r)} run(s)"
        )
    print("load average:", Path("/proc/loadavg").read_text().split()[:3])


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
