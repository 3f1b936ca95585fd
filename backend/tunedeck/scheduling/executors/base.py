"""What the scheduler, the submit checks and the nodes page ask of an executor. SQLite holds the
queue; an executor only places, starts, watches and stops the jobs the scheduler hands it, and says
what its cluster looks like. A new executor is a folder beside local/ and ray/ and a registry line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from tunedeck.planning.placement import ClusterNode
from tunedeck.store.tables import Job


@dataclass(frozen=True)
class Stopped:
    """Why the cluster ended a job that its runner saw stopped from outside tunedeck."""

    why: str
    # The cluster took the allocation back for other work (a preemption): the job is no failure of
    # its own, and the next attempt continues from its newest checkpoint (services/jobs/resume.py).
    resume: bool = False


class NodeSource(Protocol):
    """What the nodes page (`GET /api/nodes`) reads: each node with its GPUs and their holders."""

    where: str  # named in the 503 when the source cannot be read ("this host", "Ray cluster at ...")

    def nodes(self) -> list[dict[str, Any]]: ...


class Executor(Protocol):
    name: str
    # True: the scheduler's own plan (queueplan) gives devices on this host; False: the executor
    # places each job itself (`place`) and the scheduler only keeps the queue's order.
    plans_devices: bool
    # True: the cluster's own scheduler keeps the queue (Slurm): every queued job is handed to
    # `place` at once, which submits it and says when the cluster started it; `waiting` says why not.
    owns_queue: bool
    node_source: NodeSource

    def cluster(self) -> list[ClusterNode] | None:
        """The nodes placement chooses from; None where this host is the only node (its own GPUs count)."""

    def workspace_problems(self, gpus: int, nodes: int) -> list[dict[str, Any]]:
        """422 items naming nodes that could run such a job but cannot reach the server's workspace."""

    def submit_problems(self, spec: Any, gpus: int) -> list[dict[str, Any]] | None:
        """422 items for where a spec (schemas.JobSpec) asks to run; None: the generic checks of
        `cluster()` (the largest node's GPUs, the node count) apply."""

    def waiting(self, job: Job) -> str | None:
        """Why a job `place` did not start waits, in words, where the cluster says (owns_queue)."""

    def place(self, job: Job) -> bool:
        """True when everything the job asks for is reserved for it (all of it, never a part)."""

    def release(self, job: Job) -> None:
        """Give back what `place` reserved for a job that will not start now."""

    def launch(
        self,
        job: Job,
        *,
        devices: list[int],
        token: str,
        server_url: str,
        admit: Callable[[list[str]], None],
    ) -> tuple[int, float | None]:
        """Start the job's runner(s); the pid and start time of the one that reports the job's end.

        `token` is the one the scheduler made for the job. An executor whose nodes make their
        runners' tokens themselves (Ray: then no token crosses the cluster) instead calls
        `admit(their hashes)` before any runner starts, and the telemetry route takes those."""

    def alive(self, job: Job) -> bool:
        """True while the job's runner(s) run."""

    def lost(self, job: Job) -> str | None:
        """Why a job's runner is gone when the executor knows better than "runner lost"."""

    def stopped_by(self, job: Job) -> Stopped | None:
        """Why its cluster ended a job whose runner reported a stop from outside tunedeck (a signal
        no cancel sent, or the warning of the allocation's end), once the cluster says (a node
        failure, a time limit, a preemption); None where it cannot."""

    def cancel(self, job: Job) -> None:
        """The graceful stop, on every node of the job."""

    def kill(self, job: Job) -> int:
        """SIGKILL every process of the job, wherever it runs; how many there were."""

    def reap(self) -> None:
        """Collect what ended runners leave behind (exit statuses)."""

    def sweep(self, active: set[int]) -> None:
        """Free what jobs no longer queued or running still hold (placements, actors)."""
