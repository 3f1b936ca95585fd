"""One thread that owns a telemetry backend (init, every poll, shutdown) and keeps per-interval maxima.

It polls `polls` times per interval and reports, per device, the reading with the highest used
memory inside the interval: a short peak is kept, never averaged away (Determined averages ten
1 s samples; W&B and MLflow sample every 10 s). A poll that finds a device risen by its rise floor
(base.rise_floor) above its last sample ends the interval there: the spike is
sent when it is seen, not up to an interval later. The interval after such a sample runs whole.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from tunedeck.telemetry import open_backend, select
from tunedeck.telemetry.base import Reading, rise_floor, throttle_shares

# Said once per device and again when they change (a GPU's identity, its partition mode, the blocks
# its ECC errors are in), not in every sample: the server keeps them beside the first sample.
ON_CHANGE = ("serial", "uuid", "partition", "ecc_blocks")


def blocks_text(blocks: dict[str, tuple[int, int]]) -> str | None:
    """ECC counts per block as `UMC=3/1,GFX=0/2` (correctable/uncorrectable); None when all are zero."""
    return ",".join(f"{b}={ce}/{ue}" for b, (ce, ue) in sorted(blocks.items())) or None


def sample_fields(r: Reading, before: Reading | None) -> dict[str, Any]:
    """A reading's telemetry fields as a memory sample carries them (contract.protocol.MemoryIn)."""
    shares = throttle_shares(r, before)
    return {
        "util": r.util,
        "power_w": r.power_w,
        "temp_c": r.temp_c,
        "temp_junction_c": r.temp_junction_c,
        "temp_hbm_c": r.temp_hbm_c,
        "power_shared_with": r.power_shared_with,
        "ecc_correctable": r.ecc_correctable,
        "ecc_uncorrectable": r.ecc_uncorrectable,
        "throttle_power": shares.get("power"),
        "throttle_thermal": shares.get("thermal"),
        "throttle_hbm": shares.get("hbm_thermal"),
        "clock_mhz": r.clock_mhz,
        # cumulative: the server derives a rate between two samples where one is shown
        "xgmi_read_bytes": r.xgmi_read_bytes,
        "xgmi_write_bytes": r.xgmi_write_bytes,
    }


def newest_counters(kept: Reading, newest: Reading) -> None:
    """A sample keeps the poll with the most memory used, but its cumulative xGMI counters are the
    newest poll's: the sample is dated when it is sent, and a rate between two samples divides their
    counters' growth by the time between their dates."""
    kept.xgmi_read_bytes, kept.xgmi_write_bytes = newest.xgmi_read_bytes, newest.xgmi_write_bytes
    kept.xgmi_clock = newest.xgmi_clock


class Sampler:
    def __init__(
        self,
        *,
        interval_s: float = 1.0,
        polls: int = 4,
        gpus: bool = True,
        visible: list[int] | None = None,
        bus_ids: list[str] | None = None,
        root_pid: int | None = None,
        opener: Callable[..., Any] = open_backend,
        on_sample: Callable[[], Any] | None = None,
    ):
        self.interval_s = max(0.1, float(interval_s))
        self.polls = max(1, int(polls))
        self.gpus, self.visible, self.bus_ids, self.root_pid = gpus, visible or [], bus_ids, root_pid
        self.opener = opener
        self.on_sample = on_sample  # the runner sends each sample as it is taken
        self.backend_name: str | None = None
        self.reason: str | None = None
        self.indices: list[int] | None = None
        self.ready = threading.Event()
        self._line = 0
        self._last: dict[int, int] = {}  # each device's used bytes in the last sample
        self._before: dict[int, Reading] = {}  # each device's newest reading (throttle shares span it)
        self._said: dict[int, dict[str, Any]] = {}  # each device's ON_CHANGE fields as last sent
        self._out: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="memory-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def drain(self) -> list[dict[str, Any]]:
        """The samples taken since the last drain, as TelemetryBatch `memory` items."""
        with self._lock:
            out, self._out = self._out, []
        return out

    def _rose(self, best: dict[int, Reading]) -> bool:
        """Whether a device stands well above its last sample."""
        for idx, r in best.items():
            last = self._last.get(idx)
            if last is not None and r.used_bytes - last >= rise_floor(r.total_bytes):
                return True
        return False

    def _emit(self, t: float, best: dict[int, Reading]) -> None:
        with self._lock:
            for idx in sorted(best):
                r = best[idx]
                self._last[idx] = r.used_bytes
                sample = {
                    "line": self._line,
                    "t": round(t, 3),
                    "gpu": r.index,
                    "used_bytes": r.used_bytes,
                    "total_bytes": r.total_bytes,
                    **sample_fields(r, self._before.get(idx)),
                    "name": r.name,
                }
                if r.throttle_clock is not None:
                    self._before[idx] = r
                now = {
                    "serial": r.serial,
                    "uuid": r.uuid,
                    "partition": r.partition,
                    "ecc_blocks": blocks_text(r.ecc_blocks),
                }
                said = self._said.setdefault(idx, {})
                for k, v in now.items():  # each field when it changes, alone
                    if v is not None and said.get(k) != v:
                        sample[k] = said[k] = v
                self._out.append(sample)
                self._line += 1

    def _loop(self) -> None:
        backend, self.reason = self.opener(gpus=self.gpus, root_pid=self.root_pid)
        self.backend_name = backend.name
        try:
            if backend.name != "cpu":
                self.indices = select(backend.devices(), visible=self.visible, bus_ids=self.bus_ids)
            self.ready.set()
            step = self.interval_s / self.polls
            nxt = time.monotonic()
            may_end_early = True  # not twice in a row: the interval after an early sample runs whole
            while not self._stop.is_set():
                best: dict[int, Reading] = {}
                ended = False
                for k in range(self.polls):
                    if self._stop.wait(max(0.0, nxt - time.monotonic())):
                        break
                    nxt += step
                    try:
                        for r in backend.read(self.indices):
                            if r.index not in best or r.used_bytes > best[r.index].used_bytes:
                                best[r.index] = r
                            else:
                                newest_counters(best[r.index], r)
                    except Exception:
                        pass
                    if may_end_early and k < self.polls - 1 and self._rose(best):
                        ended = True
                        break
                may_end_early = not ended
                if best:
                    self._emit(time.time(), best)
                    if self.on_sample is not None:
                        self.on_sample()
        finally:
            self.ready.set()
            backend.close()
