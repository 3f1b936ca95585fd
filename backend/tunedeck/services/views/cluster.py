"""The nodes of a Ray cluster for `GET /api/nodes`: membership and liveness from Ray, each live node's
GPUs from a sampler actor placed on it (telemetry/node_actor.py), holders from the jobs table.

Ray is imported here only when the `ray` executor is chosen (the first call), never at server start.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, select

from tunedeck.store.tables import Job, JobStatus

log = logging.getLogger("tunedeck.cluster")
NAMESPACE = "tunedeck"
SAMPLER = "tunedeck-sampler-"  # + node id: one detached actor per node, found again after a restart
ASK_S = 5.0  # how long a page waits for a new node's sampler (a silent one is said, not waited on)
AGAIN_S = 0.5  # ... and for the others' fresh readings


def join_ray(address: str) -> Any:
    """The `ray` module, connected to the cluster at `address` in tunedeck's namespace (once a process)."""
    import ray  # only here: the local executor never loads Ray

    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    return ray


def holders(engine: Engine) -> dict[tuple[str, int], int]:
    """(node, device index) -> running job. From a job's `placement` (JSON list of {node, devices})
    where the executor recorded one; a job without it holds its `devices` on the node named ''."""
    out: dict[tuple[str, int], int] = {}
    with Session(engine) as s:
        for j in s.exec(select(Job).where(Job.status == JobStatus.running)):
            try:
                placed = json.loads(j.placement) if j.placement else None
            except ValueError:
                placed = None
            if isinstance(placed, list):
                for p in placed:
                    if isinstance(p, dict):
                        for d in p.get("devices") or ():
                            out[(str(p.get("node", "")), int(d))] = j.id
            elif j.devices:
                for d in j.devices.split(","):
                    out[("", int(d))] = j.id
    return out


class RayNodes:
    """Every node Ray knows (alive or dead) with its GPUs; one sampler actor per live node, started
    when first missing."""

    def __init__(self, engine: Engine, *, address: str, cache_s: float):
        self.engine, self.address, self.cache_s = engine, address, cache_s
        self.where = f"Ray cluster at {address!r}"
        self._lock = threading.Lock()
        self._one = threading.Lock()  # one reading of the cluster at a time (pages poll it concurrently)
        self._ray: Any = None
        self._handles: dict[str, Any] = {}  # node id -> its sampler actor
        self._last: dict[str, dict[str, Any]] = {}  # node id -> its newest reading
        self._pending: dict[str, Any] = {}  # node id -> a read not answered yet
        self._seen: set[str] = set()  # nodes asked before
        self._state_api = True  # Ray's state API answers through the dashboard; without one, the GCS table

    def _connect(self) -> Any:
        with self._lock:
            if self._ray is None:
                self._ray = join_ray(self.address)
            return self._ray

    def members(self) -> list[dict[str, Any]]:
        """{id, name, address, alive, head, resources} of every node, from Ray."""
        ray = self._connect()
        if self._state_api:
            try:
                from ray.util.state import list_nodes

                return [
                    {
                        "id": n.node_id,
                        "name": n.node_name or n.node_ip,
                        "address": n.node_ip,
                        "alive": n.state == "ALIVE",
                        "head": bool(n.is_head_node),
                        "resources": dict(n.resources_total or {}),
                    }
                    for n in list_nodes(detail=True, limit=10_000, timeout=int(ASK_S))
                ]
            except Exception as e:  # no dashboard (`include_dashboard=False`): the node table from the GCS
                log.info("cluster: Ray's state API is unavailable (%s); reading the GCS node table", e)
                self._state_api = False
        return [
            {
                "id": n["NodeID"],
                "name": n.get("NodeName") or n.get("NodeManagerAddress") or n["NodeID"][:8],
                "address": n.get("NodeManagerAddress"),
                "alive": bool(n.get("Alive")),
                "head": "node:__internal_head__" in (n.get("Resources") or {}),
                "resources": dict(n.get("Resources") or {}),
            }
            for n in ray.nodes()
        ]

    def _sampler(self, node_id: str) -> Any:
        if node_id in self._handles:
            return self._handles[node_id]
        ray = self._ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from tunedeck.telemetry.node_actor import NodeSampler

        self._handles[node_id] = handle = (
            ray.remote(NodeSampler)
            .options(
                name=f"{SAMPLER}{node_id}",
                namespace=NAMESPACE,
                get_if_exists=True,
                lifetime="detached",  # outlives the server: a restart finds it again by name
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
            )
            .remote(self.cache_s)
        )
        return handle

    def readings(self, node_ids: list[str]) -> dict[str, dict[str, Any]]:
        """Each node's sampler reading; a node whose sampler fails or is silent gets `reason` only.
        Only a node asked for the first time is waited on for long: a sampler still starting (a
        worker process to spawn) answers a later page, which meanwhile shows its newest reading."""
        ray = self._ray
        asked, out = {}, {}
        for nid in node_ids:
            try:
                asked[nid] = self._pending.get(nid) or self._sampler(nid).read.remote()
            except Exception as e:
                out[nid] = {"reason": f"no GPU sampler on this node: {type(e).__name__}: {e}"}
        wait = ASK_S if any(nid not in self._seen for nid in asked) else AGAIN_S
        self._seen.update(asked)
        done = set(ray.wait(list(asked.values()), num_returns=len(asked), timeout=wait)[0] if asked else ())
        for nid, ref in asked.items():
            if ref not in done:  # asked again next time, not sent again
                self._pending[nid] = ref
                why = "the node's GPU sampler has not answered yet (starting, or busy)"
                out[nid] = self._last.get(nid) or {"reason": why}
                continue
            self._pending.pop(nid, None)
            try:
                out[nid] = self._last[nid] = ray.get(ref)
            except Exception as e:  # its node died, or its actor could not start: a new one next time
                self._handles.pop(nid, None)
                self._last.pop(nid, None)
                out[nid] = {"reason": f"the node's GPU sampler failed: {type(e).__name__}"}
        return out

    def nodes(self) -> list[dict[str, Any]]:
        with self._one:
            members = self.members()
            read = self.readings([m["id"] for m in members if m["alive"]])
        held = holders(self.engine)
        out = []
        for m in sorted(members, key=lambda m: (not m["alive"], not m["head"], m["name"], m["id"])):
            r = read.get(m["id"], {})
            gpus = [
                {
                    **g,
                    "job_id": held.get((m["id"], g["index"]))
                    or held.get((m["name"], g["index"]))
                    or held.get((m["address"], g["index"])),
                }
                for g in r.get("gpus", ())
            ]
            reason = r.get("reason")
            if not m["alive"]:
                reason = "the node is dead (Ray lost it)"
            out.append(
                {
                    "name": m["name"],
                    "id": m["id"],
                    "address": m["address"],
                    "alive": m["alive"],
                    "head": m["head"],
                    "gpu_slots": int(m["resources"].get("GPU", 0)),
                    "backend": r.get("backend", "unknown"),
                    "reason": reason,
                    "gpus": gpus,
                }
            )
        return out
