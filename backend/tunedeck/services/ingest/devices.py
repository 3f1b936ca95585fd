"""Which devices a job's runners may report: the GPUs it was given on each of its nodes, and each
node's host series (gpu -1, what the CPU backend samples).

Every (node, gpu) a batch names becomes a series that the job's memory view, its report and
`/metrics` show: a runner holding the job's token could otherwise name 20,000 of them in one batch.
A batch's memory is checked before it reaches the writer: at most `gpus` GPU indices on a node and
at most `nodes` nodes, counting what the job's runners named before. What is held is how many, not
which: a runner's SMI library may number the job's devices otherwise than the server's does (the
sampler finds them by PCI bus id, telemetry.select), so the indices in `jobs.devices` are no test.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine, text

HOST = -1  # host memory: one series per node, whatever the job was given
JOBS_KEPT = 4096  # jobs whose series are remembered; an older one is read again from its samples


@dataclass
class NotGiven(Exception):
    """A batch names a device its job was not given: where (as a 422 names it) and why."""

    loc: tuple[Any, ...]
    msg: str


def _columns_loc(i: int) -> tuple[Any, ...]:
    return ("body", "memory", "gpu", i)


def _rows_loc(i: int) -> tuple[Any, ...]:
    return ("body", "memory", i, "gpu")


def gpu_column(memory: Any) -> tuple[list[int], Any]:
    """A batch's `memory` GPU indices, in either form, and how a 422 names the i-th of them."""
    if isinstance(memory, dict):
        return list(memory.get("gpu") or ()), _columns_loc
    return [m["gpu"] for m in memory or ()], _rows_loc


# Each step one seek on the samples' key (job_id, node, gpu, t, line): the next GPU of this node,
# else the first of the next node. A job's series are found without reading its samples.
_NEXT_GPU = text(
    "SELECT gpu FROM memory_samples WHERE job_id = :job AND node = :node AND gpu > :gpu ORDER BY gpu LIMIT 1"
)
_NEXT_NODE = text(
    "SELECT node, gpu FROM memory_samples WHERE job_id = :job AND node > :node ORDER BY node, gpu LIMIT 1"
)


def stored_series(engine: Engine, job_id: int, most: int) -> dict[str, set[int]]:
    """The job's stored (node, gpu) series, `most` of them at most (enough to tell "too many")."""
    found: dict[str, set[int]] = {}
    with engine.connect() as conn:
        row: tuple[Any, ...] | None = conn.execute(
            text("SELECT node, gpu FROM memory_samples WHERE job_id = :job ORDER BY node, gpu LIMIT 1"),
            {"job": job_id},
        ).first()
        n = 0
        while row is not None and n < most:
            node, gpu = row
            found.setdefault(node, set()).add(gpu)
            n += 1
            nxt = conn.execute(_NEXT_GPU, {"job": job_id, "node": node, "gpu": gpu}).scalar()
            row = (
                (node, nxt)
                if nxt is not None
                else conn.execute(_NEXT_NODE, {"job": job_id, "node": node}).first()
            )
    return found


class Devices:
    """The series each job's runners have named, checked and extended batch by batch (any thread)."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self._lock = threading.Lock()
        self._jobs: OrderedDict[int, dict[str, set[int]]] = OrderedDict()

    def admit(self, *, job_id: int, gpus: int, nodes: int, node: str, memory: Any) -> None:
        """Raise NotGiven unless every device the batch's memory names is one the job may report;
        the ones it names are then the job's (so two batches at once cannot pass the limit together)."""
        column, loc = gpu_column(memory)
        if not column:
            return
        named = _first_positions(column, gpus)  # cheap: a batch naming thousands stops at gpus + 1
        self._refuse_extra(named, set(), job_id=job_id, gpus=gpus, node=node, loc=loc)
        with self._lock:
            known = self._known(job_id, gpus=gpus, nodes=nodes)
            if node not in known and len(known) >= nodes:
                raise NotGiven(
                    ("body", "node"),
                    f"job {job_id} runs on {nodes} node(s), and its runners have named "
                    f"{', '.join(sorted(map(repr, known)))}: {node!r} is not one of its nodes",
                )
            mine = known.get(node, set())
            self._refuse_extra(named, mine, job_id=job_id, gpus=gpus, node=node, loc=loc)
            known[node] = mine | set(named)

    def _known(self, job_id: int, *, gpus: int, nodes: int) -> dict[str, set[int]]:
        known = self._jobs.get(job_id)
        if known is None:
            known = stored_series(self.engine, job_id, most=(gpus + 1) * nodes + 1)
            self._jobs[job_id] = known
            while len(self._jobs) > JOBS_KEPT:
                self._jobs.popitem(last=False)
        self._jobs.move_to_end(job_id)
        return known

    @staticmethod
    def _refuse_extra(
        named: dict[int, int], mine: set[int], *, job_id: int, gpus: int, node: str, loc: Any
    ) -> None:
        """Refuse the first GPU index that would make more than `gpus` on this node."""
        seen = sorted(g for g in mine if g != HOST)
        for gpu, i in sorted(named.items(), key=lambda kv: kv[1]):
            if gpu == HOST or gpu in seen:
                continue
            if len(seen) >= gpus:
                if gpus == 0:
                    why = f"job {job_id} runs on the CPU: its runner reports host memory only (gpu {HOST})"
                else:
                    on = f" on node {node!r}" if node else ""
                    why = (
                        f"job {job_id} was given {gpus} GPU(s) on each node, and its runner{on} names "
                        f"GPU {', '.join(map(str, seen))} (gpu {HOST} is host memory)"
                    )
                raise NotGiven(loc(i), f"{why}: GPU {gpu} is not one of the job's devices")
            seen.append(gpu)


def _first_positions(column: list[int], gpus: int) -> dict[int, int]:
    """Each index the column names and where it first appears; it stops once more than `gpus` GPU
    indices are found (one more than allowed is enough to refuse)."""
    first: dict[int, int] = {}
    gpu_count = 0
    for i, g in enumerate(column):
        if g not in first:
            first[g] = i
            if g != HOST:
                gpu_count += 1
                if gpu_count > gpus:
                    break
    return first
