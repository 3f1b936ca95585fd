"""NVIDIA GPUs through nvidia-ml-py (`pynvml`); NVMLError_LibraryNotFound means "absent"."""

from __future__ import annotations

import contextlib
from typing import Any

from tunedeck.telemetry.base import BackendAbsent, Reading, norm_bus_id, num


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


class NvidiaBackend:
    name = "nvidia"

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._names: dict[int, str] = {}
        self._bus: dict[int, str | None] = {}

    def open(self) -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:
            raise BackendAbsent(f"pynvml: {type(e).__name__}: {e}") from None
        self._nv = pynvml
        try:
            n = pynvml.nvmlDeviceGetCount()
            for i in range(n):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                self._handles[i] = h
                self._names[i] = _text(pynvml.nvmlDeviceGetName(h))
                self._bus[i] = norm_bus_id(_text(pynvml.nvmlDeviceGetPciInfo(h).busId))
        except Exception as e:
            self.close()
            raise BackendAbsent(f"pynvml: {type(e).__name__}: {e}") from None
        if not self._handles:
            self.close()
            raise BackendAbsent("pynvml: no NVIDIA GPU found")

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
        self._nv = None

    def _try(self, fn: str, *args: Any) -> Any:
        try:
            return getattr(self._nv, fn)(*args)
        except Exception:
            return None

    def read(self, indices: list[int] | None = None) -> list[Reading]:
        nv, out = self._nv, []
        for i in indices if indices is not None else sorted(self._handles):
            h = self._handles.get(i)
            mem = self._try("nvmlDeviceGetMemoryInfo", h) if h is not None else None
            if mem is None:
                continue
            util = self._try("nvmlDeviceGetUtilizationRates", h)
            power = self._try("nvmlDeviceGetPowerUsage", h)  # milliwatts
            temp = self._try("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
            pids = {}
            for p in self._try("nvmlDeviceGetComputeRunningProcesses", h) or ():
                if getattr(p, "usedGpuMemory", None) is not None:
                    pids[int(p.pid)] = int(p.usedGpuMemory)
            out.append(
                Reading(
                    index=i,
                    name=self._names[i],
                    used_bytes=int(mem.used),
                    total_bytes=int(mem.total),
                    util=num(getattr(util, "gpu", None)),
                    power_w=num(power, 1e-3),
                    temp_c=num(temp),
                    bus_id=self._bus[i],
                    pids=pids,
                )
            )
        return out

    def devices(self) -> list[Reading]:
        return self.read()
