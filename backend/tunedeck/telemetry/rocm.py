"""AMD GPUs through pyrsmi (`pyrsmi.rocml`), with the `amdsmi` package for what pyrsmi lacks.

pyrsmi gives count, name, VRAM used/total, utilisation and power; `amdsmi`, when it imports,
adds the PCI bus id, the temperature and per-process VRAM. Without ROCm `import amdsmi` raises a
KeyError (not an ImportError) and pyrsmi raises ROCMLError_LibraryNotFound: both mean "absent".
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Any

from tunedeck.telemetry.base import BackendAbsent, Reading, norm_bus_id, num


def _amdsmi() -> Any | None:
    try:  # by name: ROCm ships the module, no wheel of ours names it (PyPI's breaks `import ray`)
        return importlib.import_module("amdsmi")
    except Exception:
        return None


class RocmBackend:
    name = "rocm"

    def __init__(self) -> None:
        self._rocml: Any = None
        self._amd: Any = None
        self._handles: list[Any] = []
        self._names: dict[int, str | None] = {}
        self._totals: dict[int, int | None] = {}
        self._bus: dict[int, str | None] = {}

    def open(self) -> None:
        try:
            from pyrsmi import rocml

            rocml.smi_initialize()
        except Exception as e:
            raise BackendAbsent(f"pyrsmi: {type(e).__name__}: {e}") from None
        self._rocml = rocml
        n = rocml.smi_get_device_count()
        if not isinstance(n, int) or n <= 0:
            self.close()
            raise BackendAbsent("pyrsmi: no AMD GPU found")
        self._amd = _amdsmi()
        if self._amd is not None:
            try:  # pyrsmi already initialised it; we only borrow its handles
                self._handles = list(self._amd.amdsmi_get_processor_handles())
            except Exception:
                self._amd, self._handles = None, []
        for i in range(n):
            self._names[i] = rocml.smi_get_device_name(i) or None
            total = num(rocml.smi_get_device_memory_total(i))
            self._totals[i] = int(total) if total else None
            bus = self._amd_call("amdsmi_get_gpu_device_bdf", i)
            self._bus[i] = norm_bus_id(bus if bus is not None else rocml.smi_get_device_pci_id(i))

    def _amd_call(self, fn: str, i: int, *args: Any) -> Any:
        if self._amd is None or i >= len(self._handles):
            return None
        try:
            return getattr(self._amd, fn)(self._handles[i], *args)
        except Exception:
            return None

    def close(self) -> None:
        if self._rocml is not None:
            with contextlib.suppress(Exception):
                self._rocml.smi_shutdown()
        self._rocml = None

    def _temp(self, i: int) -> float | None:
        amd = self._amd
        if amd is None:
            return None
        try:
            sensor = amd.AmdSmiTemperatureType.EDGE
            metric = amd.AmdSmiTemperatureMetric.CURRENT
        except Exception:
            return None
        return num(self._amd_call("amdsmi_get_temp_metric", i, sensor, metric))

    def _pids(self, i: int) -> dict[int, int]:
        out: dict[int, int] = {}
        for p in self._amd_call("amdsmi_get_gpu_process_list", i) or ():
            try:
                out[int(p["pid"])] = int(p["memory_usage"]["vram_mem"])
            except Exception:
                continue
        return out

    def read(self, indices: list[int] | None = None) -> list[Reading]:
        r = self._rocml
        out = []
        for i in indices if indices is not None else sorted(self._names):
            used = num(r.smi_get_device_memory_used(i))
            if used is None:
                continue
            out.append(
                Reading(
                    index=i,
                    name=self._names.get(i),
                    used_bytes=int(used),
                    total_bytes=self._totals.get(i),
                    util=num(r.smi_get_device_utilization(i)),
                    power_w=num(r.smi_get_device_average_power(i)),
                    temp_c=self._temp(i),
                    bus_id=self._bus.get(i),
                    pids=self._pids(i),
                )
            )
        return out

    def devices(self) -> list[Reading]:
        return self.read()
