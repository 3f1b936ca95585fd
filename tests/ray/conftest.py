"""One Ray cluster of two GPU nodes on this machine, and one tunedeck server using it, for tests/ray.

The GPUs are Ray's logical resources: the trainers run on the CPU (gloo), as everywhere in CI, while
placement, visible devices and the rendezvous go through Ray exactly as on a real cluster.
"""

from __future__ import annotations

import pytest

from tests.utils.servers import Server, free_port

ray_utils = pytest.importorskip("ray.cluster_utils")
pytestmark = pytest.mark.slow

STORE = 80 * 1024 * 1024  # Ray's object store per node: tunedeck passes nothing big through it


def head_ports() -> dict[str, int]:
    """The head's dashboard and dashboard agent on free ports, not Ray's fixed defaults (8265, 52365):
    another cluster on this machine (another session's, or test_nodes_page's) may hold those."""
    return {"dashboard_port": free_port(), "dashboard_agent_listen_port": free_port()}


@pytest.fixture(scope="session")
def ray_cluster():
    """A head without GPUs (nothing is placed there) and two nodes of 2 CPUs and 1 GPU each. The head
    runs the dashboard, which serves Ray's state API (`ray.util.state`): the tests read what it shows."""
    cluster = ray_utils.Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "num_gpus": 0,
            "include_dashboard": True,
            "object_store_memory": STORE,
            **head_ports(),
        },
    )
    for _ in range(2):
        cluster.add_node(num_cpus=2, num_gpus=1, object_store_memory=STORE)
    cluster.wait_for_nodes()
    yield cluster
    cluster.shutdown()


@pytest.fixture(scope="session")
def ray_server(ray_cluster, assets, tmp_path_factory):
    """The server, with the ray executor joined to the cluster; every node sees its workspace."""
    server = Server(
        tmp_path_factory.mktemp("ray") / "ws",
        assets,
        TUNEDECK_EXECUTOR="ray",
        TUNEDECK_RAY_ADDRESS=ray_cluster.address,
        TUNEDECK_CANCEL_ABORT_GRACE_S="60",
    )
    yield server.start()
    server.stop()
