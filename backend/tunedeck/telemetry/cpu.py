"""Host memory: the resident memory of a job's whole process tree against the host total.

With no GPU this is what a training run uses, so the CPU demo has a real memory curve.
"""

from __future__ import annotations

import platform
import time

import psutil

from tunedeck.telemetry.base import Reading

TREE_REFRESH_S = 1.0


class CpuBackend:
    name = "cpu"

    def __init__(self, root_pid: int | None = None) -> None:
        self.root_pid = root_pid
        self._procs: dict[int, psutil.Process] = {}  # kept: cpu_percent needs the same objects
        self._tree_at = 0.0

    def open(self) -> None:
        pass

    def close(self) -> None:
        self._procs.clear()

    def _tree(self) -> list[psutil.Process]:
        # Finding the children walks all of /proc: do it once a second, not at every poll.
        if self._procs and time.monotonic() - self._tree_at < TREE_REFRESH_S:
            return list(self._procs.values())
        self._tree_at = time.monotonic()
        try:
            root = psutil.Process(self.root_pid) if self.root_pid else None
            found = [root, *root.children(recursive=True)] if root else []
        except psutil.Error:
            found = []
        keep = {}
        for p in found:
            keep[p.pid] = self._procs.get(p.pid) or p
        self._procs = keep
        return list(keep.values())

    def read(self, indices: list[int] | None = None) -> list[Reading]:
        vm = psutil.virtual_memory()
        if self.root_pid is None:  # the node view: memory in use on the host
            return [
                Reading(
                    index=-1,
                    name=platform.node() or "host",
                    used_bytes=int(vm.total - vm.available),
                    total_bytes=int(vm.total),
                    util=psutil.cpu_percent(interval=None),
                )
            ]
        rss, util, pids = 0, 0.0, {}
        for p in self._tree():
            try:
                with p.oneshot():
                    if p.status() == psutil.STATUS_ZOMBIE:  # exited, not reaped yet: reads as 0 B
                        continue
                    r = p.memory_info().rss
                    util += p.cpu_percent(interval=None)
            except psutil.Error:
                continue
            rss += r
            pids[p.pid] = r
        if not pids:  # the trainer has exited: no reading, not a 0 B sample (at the end of the
            return []  # memory chart, that drop reads as a crash)
        return [
            Reading(
                index=-1,
                name="host memory (job process tree)",
                used_bytes=rss,
                total_bytes=int(vm.total),
                util=util,
                pids=pids,
            )
        ]

    def devices(self) -> list[Reading]:
        return self.read()
