"""This host's GPUs for the node inventory, read with the same telemetry backends as the runners."""

from __future__ import annotations

import platform
import threading
import time
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, select

from tunedeck.checks import preflight
from tunedeck.config import Settings
from tunedeck.store.tables import Job, JobStatus
from tunedeck.telemetry import absence, detect_gpus
from tunedeck.telemetry.base import Reading, node_fields


def job_of(pid: int, trainers: dict[int, int]) -> int | None:
    """The job whose trainer process is `pid` or one of its ancestors (torchrun's workers hold the GPUs)."""
    try:
        import psutil

        proc: psutil.Process | None = psutil.Process(pid)
        while proc is not None:
            if proc.pid in trainers:
                return trainers[proc.pid]
            proc = proc.parent()
    except Exception:
        return None
    return None


class NodeInventory:
    """Reads the SMI libraries at most every `cache_s` (init, one poll, shutdown: nothing stays open)."""

    where = "this host"

    def __init__(self, engine: Engine, cache_s: float = 3.0):
        self.engine, self.cache_s = engine, cache_s
        self._lock = threading.Lock()
        self._at: float | None = None  # when the SMI libraries were last read
        self._reading: tuple[str, str | None, list] = ("cpu", None, [])
        self._before: dict[int, Reading] = {}  # each GPU's reading before the newest (throttle shares)

    def reading(self, *, max_age_s: float | None = None) -> tuple[str, str | None, list]:
        """(backend, why GPUs are absent, one reading per GPU), read again when older than
        `max_age_s` (default `cache_s`)."""
        with self._lock:
            age = self.cache_s if max_age_s is None else max_age_s
            if self._at is None or time.monotonic() - self._at > age:
                try:
                    old = {r.index: r for r in self._reading[2]}
                    self._reading = detect_gpus()
                    self._before = {i: old[i] for i in (r.index for r in self._reading[2]) if i in old}
                except Exception as e:
                    self._reading = ("cpu", f"{type(e).__name__}: {e}", [])
                self._at = time.monotonic()
            return self._reading

    def smallest_gpu_bytes(self) -> int | None:
        """Memory of this host's smallest GPU (what a job must fit in); None without GPUs. A GPU's
        size does not change while the server runs: any earlier reading answers."""
        totals = [r.total_bytes for r in self.reading(max_age_s=float("inf"))[2] if r.total_bytes]
        return min(totals) if totals else None

    def bus_ids(self, devices: list[int]) -> list[str]:
        """The PCI bus ids of these device indices, or [] when any is unknown (the sampler then goes
        by index). The runner's SMI library (the training environment's) may number the devices
        otherwise than this server's; a bus id names the same device for both. Bus ids do not change
        while the server runs: any earlier reading answers."""
        by_index = {r.index: r.bus_id for r in self.reading(max_age_s=float("inf"))[2]}
        ids = [b for d in devices if (b := by_index.get(d))]
        return ids if len(ids) == len(devices) else []

    def nodes(self) -> list[dict[str, Any]]:
        name, reason, readings = self.reading()
        with self._lock:
            before = dict(self._before)
        with Session(self.engine) as s:
            running = list(s.exec(select(Job).where(Job.status == JobStatus.running)))
        holders = {int(d): j.id for j in running if j.devices for d in j.devices.split(",")}
        trainers = {j.trainer_pid: j.id for j in running if j.trainer_pid}
        gpus = []
        for r in readings:
            gpu = node_fields(r, before.get(r.index)) | {"job_id": holders.get(r.index)}
            for p in gpu["processes"]:
                p["job_id"] = job_of(p["pid"], trainers)
            gpus.append(gpu)
        host = platform.node() or "localhost"
        return [{"name": host, "backend": name, "reason": reason, "summary": absence(reason), "gpus": gpus}]


def node_preflight(settings: Settings) -> dict[str, Any] | None:
    """The node's preflight when one is cached (submission never waits for the probe)."""
    return preflight.cached(settings.train_python, ttl=settings.preflight_ttl_s)


def warm_preflight(settings: Settings) -> None:
    """Run the node's preflight in the background (a subprocess; the server does not wait)."""
    threading.Thread(
        target=preflight.run,
        args=(settings.train_python,),
        kwargs={"ttl": settings.preflight_ttl_s},
        name="preflight",
        daemon=True,
    ).start()
