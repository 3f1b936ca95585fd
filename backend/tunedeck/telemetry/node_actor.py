"""One node's GPU readings for the cluster's nodes page: the body of a Ray actor the server places on
each node (services/views/cluster.py), read with the same backends as the job runners.

This module imports no Ray: the server wraps the class with `ray.remote` where Ray is in use.
"""

from __future__ import annotations

import platform
import threading
import time
from typing import Any

from tunedeck.telemetry import detect_gpus
from tunedeck.telemetry.base import Reading, node_fields


class NodeSampler:
    """Opens the SMI libraries at most every `cache_s` (init, one poll, shutdown: nothing stays open).
    A read never waits for the libraries once there is a reading: a stale one is answered while a
    fresh one is taken in the background (a page over many nodes waits for none of them)."""

    def __init__(self, cache_s: float = 3.0):
        self.cache_s = cache_s
        self._lock = threading.Lock()
        self._at: float | None = None  # when the last reading was taken
        self._busy = False
        self._first = threading.Event()
        self._reading: dict[str, Any] = {}
        self._readings: list[Reading] = []  # the last poll's, for throttle shares over the next

    def _take(self) -> None:
        try:
            backend, reason, readings = detect_gpus()
        except Exception as e:  # a broken library reads as "no GPU", with why
            backend, reason, readings = "cpu", f"{type(e).__name__}: {e}", []
        before = {r.index: r for r in self._readings}
        gpus = [node_fields(r, before.get(r.index)) for r in readings]
        self._readings = readings
        with self._lock:
            self._reading = {"host": platform.node(), "backend": backend, "reason": reason, "gpus": gpus}
            self._at, self._busy = time.monotonic(), False
        self._first.set()

    def read(self, wait_s: float = 30.0) -> dict[str, Any]:
        """{host, backend, reason (why no GPUs), gpus: [telemetry.base.node_fields of each GPU]}"""
        with self._lock:
            stale = self._at is None or time.monotonic() - self._at > self.cache_s
            if stale and not self._busy:
                self._busy = True
                threading.Thread(target=self._take, name="node-sampler", daemon=True).start()
        self._first.wait(wait_s)  # only the first read waits
        with self._lock:
            return self._reading
