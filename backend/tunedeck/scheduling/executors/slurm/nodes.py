"""The nodes page on Slurm (`GET /api/nodes`): every node of the cluster as `scontrol show node`
says it (state, GPUs as GRES, a drained or down node's reason), and which tunedeck job holds it
(from the jobs' placement). GPU memory is read by each job's runner, on its node, not here."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, select

from tunedeck.scheduling.executors.slurm.cluster import Cluster
from tunedeck.store.tables import Job, JobStatus


class SlurmNodes:
    where = "the Slurm cluster (scontrol)"

    def __init__(self, slurm: Cluster, engine: Engine, *, cache_s: float):
        self.slurm, self.engine, self.cache_s = slurm, engine, cache_s
        self._lock = threading.Lock()
        self._at = -float("inf")
        self._last: list[Any] = []

    def _held(self) -> dict[str, list[int]]:
        """Slurm node name -> the running tunedeck jobs placed there."""
        out: dict[str, list[int]] = {}
        with Session(self.engine) as s:
            for j in s.exec(select(Job).where(Job.status == JobStatus.running)):
                try:
                    placed = json.loads(j.placement or "[]")
                except ValueError:
                    continue
                for p in placed if isinstance(placed, list) else ():
                    if isinstance(p, dict) and p.get("node"):
                        out.setdefault(str(p["node"]), []).append(j.id)
        return out

    def nodes(self) -> list[dict[str, Any]]:
        with self._lock:  # pages poll concurrently: one scontrol per cache period
            if time.monotonic() - self._at > self.cache_s:
                self._last = self.slurm.nodes()  # SlurmError: the page's 503 names `where`
                self._at = time.monotonic()
            found = self._last
        held = self._held()
        out = []
        for n in found:
            jobs = held.get(n.name, [])
            flags = set(n.state.split("+"))
            reason = n.reason
            if not n.usable:
                what = "down" if flags & {"DOWN", "NOT_RESPONDING", "FAIL"} else "drained"
                reason = f"{what} ({n.state}): {n.reason or 'no reason given'}"
            out.append(
                {
                    "name": n.name,
                    "id": n.name,
                    "address": n.addr,
                    "alive": n.usable or not flags & {"DOWN", "NOT_RESPONDING"},
                    "head": False,
                    "gpu_slots": n.gpus,
                    "backend": "slurm",
                    "reason": reason,
                    "state": n.state,
                    "jobs": jobs,
                    "gpus": [
                        {
                            "index": i,
                            "name": None,
                            "bus_id": None,
                            "total_bytes": None,
                            "used_bytes": 0,
                            "util": None,
                            "job_id": jobs[0] if len(jobs) == 1 else None,
                        }
                        for i in range(n.gpus)
                    ],
                }
            )
        return out
