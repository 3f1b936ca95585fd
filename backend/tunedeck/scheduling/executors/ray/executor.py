"""Ray executor: each job gets a placement group (one bundle per node) and, in each bundle, a
detached named actor that starts that node's runner. Imported only when TUNEDECK_EXECUTOR=ray.

Detached and named, the groups and actors outlive this server: a restarted server finds them by
name. A job's end (or its cancel while queued) frees its group and actors at the next sweep.
"""

from __future__ import annotations

import json
import logging
import math
import re
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayError
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy
from sqlalchemy.engine import Engine

from tunedeck.checks import spec
from tunedeck.config import Settings
from tunedeck.contract import runfiles
from tunedeck.contract.protocol import node_name
from tunedeck.planning import placement, queueplan
from tunedeck.planning.placement import ClusterNode
from tunedeck.problems import detail
from tunedeck.scheduling.executors.base import Stopped
from tunedeck.scheduling.executors.local.executor import runner_config
from tunedeck.scheduling.executors.ray.actor import JobNode, read_probe
from tunedeck.services.views.cluster import NAMESPACE, RayNodes, join_ray
from tunedeck.store.tables import Job

log = logging.getLogger("tunedeck.ray")
START_TIMEOUT_S = 300.0  # an actor's first start on a node imports Ray and tunedeck there
CALL_TIMEOUT_S = 10.0  # a node that answers no later is asked again at the next pass
PROBE_TTL_S = 300.0  # a node that read the workspace probe is not asked again for this long
SWEEP_S = 2.0
GROUP = re.compile(r"^tunedeck-job-(\d+)$")
ACTOR = re.compile(r"^tunedeck-job-(\d+)-rank(\d+)$")


def group_name(job_id: int) -> str:
    return f"tunedeck-job-{job_id}"


def actor_name(job_id: int, rank: int) -> str:
    return f"tunedeck-job-{job_id}-rank{rank}"


def job_key(job: Job, rank: int) -> str:
    """Rank 0 keeps the run folder as its key; each other rank has its own, so a node's clean-up
    never reaches another node's processes (on one machine, too)."""
    return job.run_dir if rank == 0 else f"{job.run_dir}#rank{rank}"


def rendezvous(job: Job, rank: int, first: dict[str, Any]) -> dict[str, str]:
    """torchrun's multi-node variables, as `llamafactory-cli` passes them on: node 0 is the master."""
    if job.nodes < 2:
        return {}
    return {
        "FORCE_TORCHRUN": "1",
        "NNODES": str(job.nodes),
        "NODE_RANK": str(rank),
        "NPROC_PER_NODE": str(max(job.gpus, 1)),
        "MASTER_ADDR": first["ip"],
        "MASTER_PORT": str(first["port"]),
    }


class RayExecutor:
    name = "ray"
    plans_devices = False
    owns_queue = False

    def __init__(self, settings: Settings, *, engine: Engine):
        self.settings = settings
        join_ray(settings.ray_address)
        self.node_source = RayNodes(engine, address=settings.ray_address, cache_s=settings.nodes_cache_s)
        # Any: Ray types an actor's methods only where @ray.method decorates them, and the actor's
        # module imports Ray only inside them (it is imported on the nodes).
        self._node: Any = ray.remote(JobNode)
        self._probe = ray.remote(read_probe)
        self._groups: dict[int, PlacementGroup] = {}
        self._lost: dict[int, str] = {}
        self._read_ok: dict[str, float] = {}  # node id → when it last read the workspace probe
        self._swept = -math.inf  # never swept: the first sweep is due at once (monotonic counts from boot)

    # ------------------------------------------------------------------ the cluster
    def cluster(self) -> list[ClusterNode]:
        out = []
        for n in ray.nodes():
            res = n.get("Resources") or {}
            out.append(
                ClusterNode(
                    name=n.get("NodeManagerHostname") or n["NodeManagerAddress"],
                    ip=n["NodeManagerAddress"],
                    gpus=int(res.get("GPU", 0)),
                    cpus=float(res.get("CPU", 0)),
                    alive=bool(n.get("Alive")),
                    node_id=n["NodeID"],
                )
            )
        return out

    def workspace_problems(self, gpus: int, nodes: int) -> list[dict[str, Any]]:
        """422 items naming each node that may run the job and cannot read the server's workspace."""
        now = time.monotonic()
        todo = [
            n
            for n in placement.candidates(gpus, self.cluster())
            if now - self._read_ok.get(n.node_id, -PROBE_TTL_S) >= PROBE_TTL_S
        ]
        if not todo:
            return []
        ws = self.settings.workspace.resolve()
        probe, word = ws / f".probe-{secrets.token_hex(8)}", secrets.token_hex(16)
        probe.write_text(word)
        problems = []
        try:
            refs = [
                self._probe.options(
                    num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False)
                ).remote(str(probe))
                for n in todo
            ]
            for n, ref in zip(todo, refs):
                try:
                    got = ray.get(ref, timeout=60)
                except GetTimeoutError:
                    got = "it did not answer within 60 s"
                except RayError as e:
                    got = f"the check failed there: {type(e).__name__}"
                if got == word:
                    self._read_ok[n.node_id] = now
                else:
                    problems.append(
                        detail(
                            ["nodes"],
                            f"node {n.label} does not see the workspace {ws} ({got}); run folders "
                            "must be on storage every node mounts at the same path",
                        )
                    )
        finally:
            probe.unlink(missing_ok=True)
        return problems

    # ------------------------------------------------------------------ placement
    def _group(self, job: Job, *, create: bool) -> PlacementGroup | None:
        pg = self._groups.get(job.id)
        if pg is None:
            try:  # a group made before a restart (one given back does not count)
                pg = ray.util.get_placement_group(group_name(job.id))
                if placement_group_table(pg).get("state") == "REMOVED":
                    pg = None
            except ValueError:
                pg = None
            if pg is None and create:
                pg = placement_group(
                    placement.bundles(job.gpus, job.nodes),
                    strategy=placement.strategy(job.nodes),
                    name=group_name(job.id),
                    lifetime="detached",
                )
            if pg is not None:
                self._groups[job.id] = pg
        return pg

    def submit_problems(self, spec: Any, gpus: int) -> None:
        return None  # the generic checks of cluster()

    def waiting(self, job: Job) -> None:
        return None

    def place(self, job: Job) -> bool:
        pg = self._group(job, create=True)
        return placement_group_table(pg).get("state") == "CREATED"

    def release(self, job: Job) -> None:
        pg = self._groups.pop(job.id, None)
        if pg is not None:
            _remove(pg)

    # ------------------------------------------------------------------ launch
    def launch(
        self,
        job: Job,
        *,
        devices: list[int],
        token: str,
        server_url: str,
        admit: Callable[[list[str]], None],
    ) -> tuple[int, float | None]:
        """Each rank's actor makes its runner's token: `token` stays here, and only hashes cross Ray."""
        pg = self._group(job, create=False)
        if pg is None:
            raise RuntimeError(f"placement group {group_name(job.id)} is gone")
        actors = [
            self._node.options(
                name=actor_name(job.id, r),
                namespace=NAMESPACE,
                lifetime="detached",
                max_restarts=0,
                num_cpus=1,  # the bundle's CPU: the runner's
                num_gpus=job.gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r),
            ).remote(job_key(job, r))
            for r in range(job.nodes)
        ]
        where = ray.get([a.info.remote(r == 0) for r, a in enumerate(actors)], timeout=START_TIMEOUT_S)
        hashes = [info.pop("token_sha256") for info in where]
        if not all(hashes):  # an actor whose runner started already (never one made just now)
            raise RuntimeError("a rank's actor has handed out its runner's token already")
        run_dir, s = Path(job.run_dir), self.settings
        names = node_names(where)
        for r, info in enumerate(where):
            env = spec.launch_env(
                gpus=job.gpus,
                devices=info["gpu_ids"],  # Ray's numbering on that node, as CUDA/HIP_VISIBLE_DEVICES
                deepspeed=job.ds_config is not None,
                offline=not s.allow_hub,
                job_env=queueplan.asked(job).env,
                nodes=job.nodes,
            )
            env.update(rendezvous(job, r, where[0]))
            runner_config(
                s,
                job,
                server_url=server_url,
                env=env,
                bus_ids=[],
                rank=r,
                node=names[r],
                job_key=job_key(job, r),
                watch_parent=True,
            ).write(run_dir)
        admit(hashes)  # before any runner starts: its first batch must find its token accepted
        started = ray.get(
            [a.start.remote(str(s.train_python), job.run_dir, r) for r, a in enumerate(actors)],
            timeout=START_TIMEOUT_S,
        )
        for info, (pid, _) in zip(where, started):
            info["runner_pid"] = pid
        # Which GPUs of which node the job holds, for the nodes page (the scheduler stores the job).
        job.placement = json.dumps([{"node": i["node_id"], "devices": i["gpu_ids"]} for i in where])
        (run_dir / runfiles.PLACEMENT).write_text(
            json.dumps([{"rank": r, **info} for r, info in enumerate(where)], indent=2)
        )
        log.info(
            "job %s placed: %s", job.id, ", ".join(f"rank {r} on {_label(i)}" for r, i in enumerate(where))
        )
        return started[0]

    # ------------------------------------------------------------------ watch and stop
    def _actor(self, job: Job, rank: int):
        return ray.get_actor(actor_name(job.id, rank), namespace=NAMESPACE)

    def alive(self, job: Job) -> bool:
        """Every rank's actor lives and rank 0's runner runs; a dead actor is its node lost."""
        for r in range(job.nodes):
            try:
                running = ray.get(self._actor(job, r).running.remote(), timeout=CALL_TIMEOUT_S)
            except (GetTimeoutError, ActorUnavailableError):
                continue  # busy or unreachable for now: Ray says when it is dead
            except (ValueError, RayActorError):
                self._lost[job.id] = f"node {self._where(job, r)} lost (rank {r}'s actor is gone)"
                return False
            if r == 0 and not running:
                return False
        return True

    def lost(self, job: Job) -> str | None:
        return self._lost.pop(job.id, None)

    def stopped_by(self, job: Job) -> Stopped | None:
        return None  # Ray signals no runner: a lost node is the watch's to find (alive, lost)

    def cancel(self, job: Job) -> None:
        for r in range(job.nodes):
            try:
                ray.get(self._actor(job, r).cancel.remote(), timeout=CALL_TIMEOUT_S)
            except (ValueError, RayError):
                pass  # a lost node: the watch ends the job

    def kill(self, job: Job) -> int:
        """Every rank's processes, through its actor; then the actors and the group go."""
        n = 0
        for r in range(job.nodes):
            try:
                actor = self._actor(job, r)
            except ValueError:
                continue
            try:
                n += ray.get(actor.kill.remote(), timeout=60)
            except RayError:
                pass  # its node is gone, and its runner ended with its actor
            ray.kill(actor, no_restart=True)
        self._groups.pop(job.id, None)
        if self._group(job, create=False) is not None:
            self.release(job)
        return n

    def reap(self) -> None:
        pass

    def sweep(self, active: set[int]) -> None:
        """Actors and groups of jobs that are no longer queued or running (ended, cancelled, deleted)."""
        if time.monotonic() - self._swept < SWEEP_S:
            return
        self._swept = time.monotonic()
        for entry in ray.util.list_named_actors(all_namespaces=True):
            m = ACTOR.match(entry.get("name", "")) if entry.get("namespace") == NAMESPACE else None
            if m and int(m[1]) not in active:
                try:
                    actor = ray.get_actor(entry["name"], namespace=NAMESPACE)
                    ray.get(actor.kill.remote(), timeout=60)
                except (ValueError, RayError):
                    pass
                else:
                    ray.kill(actor, no_restart=True)
        for info in placement_group_table().values():
            m = GROUP.match(info.get("name") or "")
            if m and int(m[1]) not in active and info.get("state") != "REMOVED":
                self._groups.pop(int(m[1]), None)
                try:
                    _remove(ray.util.get_placement_group(info["name"]))
                except ValueError:
                    pass

    def _where(self, job: Job, rank: int) -> str:
        try:
            return _label(json.loads((Path(job.run_dir) / runfiles.PLACEMENT).read_text())[rank])
        except (OSError, ValueError, IndexError, KeyError):
            return f"of rank {rank}"


def node_names(where: list[dict[str, Any]]) -> list[str]:
    """What each rank's batches call its node: the host name, or host-<node id> where two ranks share a
    host (Ray nodes on one machine), so every rank's samples keep a series of their own."""
    hosts = [node_name(i["host"]) for i in where]
    if len(set(hosts)) == len(hosts):
        return hosts
    return [f"{h}-{i['node_id'][:8]}" for h, i in zip(hosts, where)]


def _label(info: dict[str, Any]) -> str:
    return f"{info['host']} ({info['ip']}, node {info['node_id'][:8]})"


def _remove(pg: PlacementGroup) -> None:
    try:
        remove_placement_group(pg)
    except (ValueError, RayError):
        pass  # removed already
