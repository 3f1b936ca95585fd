"""Placement on a cluster, without Ray: what a job's placement group asks for, whether a job can
ever fit the cluster, and the queue's order when the executor places jobs itself.

The ray executor (scheduling/executors/ray/executor.py) turns these into Ray calls; keeping them here lets the
server check a submission and order the queue without importing Ray.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from tunedeck.planning.queueplan import STARTING, Spot, asked
from tunedeck.problems import detail
from tunedeck.store.tables import Job, utcnow


@dataclass(frozen=True)
class ClusterNode:
    name: str  # the host name as the node reports it
    ip: str
    gpus: int
    cpus: float
    alive: bool = True
    node_id: str = ""

    @property
    def label(self) -> str:
        return self.name if self.name == self.ip else f"{self.name} ({self.ip})"


def bundles(gpus: int, nodes: int) -> list[dict[str, float]]:
    """One bundle per node: its GPUs and one CPU for the runner (a CPU job: the CPU alone)."""
    one = {"GPU": float(gpus), "CPU": 1.0} if gpus else {"CPU": 1.0}
    return [dict(one) for _ in range(nodes)]


def strategy(nodes: int) -> str:
    """Each node's bundle on a node of its own; a one-node job anywhere it fits."""
    return "STRICT_SPREAD" if nodes > 1 else "PACK"


def refusal(gpus: int, nodes: int, cluster: list[ClusterNode]) -> list[dict[str, Any]]:
    """422 items for a job that can never fit the cluster as it is, naming the largest node."""
    alive = [n for n in cluster if n.alive]
    if not alive:
        return [detail(["nodes"], "the Ray cluster has no live node")]
    largest = max(alive, key=lambda n: (n.gpus, n.cpus))
    if gpus > largest.gpus:
        return [
            detail(
                ["gpus"],
                f"asks for {gpus} GPUs on each node; the largest node, {largest.label}, has {largest.gpus}",
            )
        ]
    fit = [n for n in alive if n.gpus >= gpus and n.cpus >= 1]
    if nodes > len(fit):
        each = f"{gpus} GPUs" if gpus else "a CPU"
        return [
            detail(
                ["nodes"],
                f"asks for {nodes} nodes with {each} each; the cluster has {len(fit)} such node(s) "
                f"(largest node: {largest.label}, {largest.gpus} GPUs)",
            )
        ]
    return []


def candidates(gpus: int, cluster: list[ClusterNode]) -> list[ClusterNode]:
    """The live nodes a job's bundle may land on."""
    return [n for n in cluster if n.alive and n.gpus >= gpus and n.cpus >= 1]


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


def order(
    queued: list[Job],
    *,
    place: Callable[[Job], bool],
    release: Callable[[Job], None],
    backfill_max_wait_s: float,
    now: datetime | None = None,
) -> tuple[list[Job], dict[int, Spot]]:
    """One pass for an executor that places jobs itself: the scheduler's rules on the cluster.

    Jobs in order of priority, then age, each placed whole or not at all. A job that cannot be
    placed yet stops every job of lower priority; jobs of its priority behind it may still start on
    what it cannot use, until it has waited `backfill_max_wait_s`: then nothing behind it is placed
    (their pending reservations are given back) so it gets the capacity as it frees.
    """
    now = now or utcnow()
    starts: list[Job] = []
    spots: dict[int, Spot] = {}
    waiting: Job | None = None  # the first job that could not be placed
    keeping = False  # ... and it keeps everything that frees
    for position, job in enumerate(sorted(queued, key=lambda j: (-asked(j).priority, j.id)), start=1):
        if waiting is not None and (keeping or asked(job).priority < asked(waiting).priority):
            release(job)
            higher = asked(waiting).priority > asked(job).priority
            spots[job.id] = Spot(
                position, f"behind job {waiting.id} ({'higher priority' if higher else 'queued earlier'})"
            )
            continue
        if place(job):
            starts.append(job)
            spots[job.id] = Spot(position, STARTING)
            continue
        each = f"{job.gpus} GPU{'s' if job.gpus != 1 else ''}" if job.gpus else "a CPU"
        spots[job.id] = Spot(position, f"{job.nodes} node(s) with {each} free on the Ray cluster")
        if waiting is None:
            waiting = job
            keeping = (now - _aware(job.created_at)).total_seconds() >= backfill_max_wait_s
    return starts, spots
