"""NVIDIA GPUs through nvidia-ml-py (`pynvml`); NVMLError_LibraryNotFound means "absent"."""

from __future__ import annotations

import contextlib
from typing import Any

from tunedeck.telemetry.base import BackendAbsent, Reading, no_devices, norm_bus_id, num


def _text(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


# nvmlClocksEventReason* bits (nvml.h): the ones that say power or heat holds the clocks down
NV_REASONS = (
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x20, "sw_thermal"),
    (0x40, "hw_thermal"),
    (0x80, "hw_power_brake"),
)


class NvidiaBackend:
    name = "nvidia"

    def __init__(self) -> None:
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self._names: dict[int, str] = {}
        self._bus: dict[int, str | None] = {}
        self._uuid: dict[int, str | None] = {}
        self._serial: dict[int, str | None] = {}

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
                self._uuid[i] = self._id("nvmlDeviceGetUUID", h)
                self._serial[i] = self._id("nvmlDeviceGetSerial", h)
        except Exception as e:
            self.close()
            raise BackendAbsent(f"pynvml: {type(e).__name__}: {e}") from None
        if not self._handles:
            self.close()
            raise no_devices("pynvml", "NVIDIA")

    def close(self) -> None:
        if self._nv is not None:
            with contextlib.suppress(Exception):
                self._nv.nvmlShutdown()
        self._nv = None

    def _id(self, fn: str, h: Any) -> str | None:
        v = self._try(fn, h)
        return _text(v) if v else None

    def _const(self, name: str, default: int) -> int:
        return getattr(self._nv, name, default)

    def _ecc(self, h: Any, kind: str, default: int) -> int | None:
        """Volatile counts (since the driver loaded, what AMD's totals count too); NOT_SUPPORTED where
        ECC is off or the board has none."""
        v = self._try(
            "nvmlDeviceGetTotalEccErrors",
            h,
            self._const(kind, default),
            self._const("NVML_VOLATILE_ECC", 0),
        )
        n = num(v)
        return None if n is None else int(n)

    def _throttle(self, h: Any, r: Reading) -> None:
        """Violation time (ns, cumulative) per policy over NVML's reference clock (us): the same
        residency the AMD counters give. The active reasons are the clocks-event bitmask."""
        acc, clock = {}, None
        for kind, policy, default in (
            ("power", "NVML_PERF_POLICY_POWER", 0),
            ("thermal", "NVML_PERF_POLICY_THERMAL", 1),
        ):
            v = self._try("nvmlDeviceGetViolationStatus", h, self._const(policy, default))
            if v is not None and num(getattr(v, "violationTime", None)) is not None:
                acc[kind] = float(v.violationTime) / 1000.0  # ns -> us, the reference clock's unit
                clock = num(getattr(v, "referenceTime", None))
        if acc and clock is not None:
            r.throttle_acc, r.throttle_clock = acc, clock
        mask = self._try("nvmlDeviceGetCurrentClocksEventReasons", h)
        if mask is None:  # the older name of the same call
            mask = self._try("nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if isinstance(mask, int):
            r.throttle_reasons = [name for bit, name in NV_REASONS if mask & bit]

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
            pids, names = {}, {}
            for p in self._try("nvmlDeviceGetComputeRunningProcesses", h) or ():
                if getattr(p, "usedGpuMemory", None) is not None:
                    pids[int(p.pid)] = int(p.usedGpuMemory)
                if proc := self._try("nvmlSystemGetProcessName", int(p.pid)):
                    names[int(p.pid)] = _text(proc)
            clock = self._try("nvmlDeviceGetClockInfo", h, self._const("NVML_CLOCK_SM", 1))
            reading = Reading(
                index=i,
                name=self._names[i],
                used_bytes=int(mem.used),
                total_bytes=int(mem.total),
                util=num(getattr(util, "gpu", None)),
                power_w=num(power, 1e-3),
                temp_c=num(temp),
                bus_id=self._bus[i],
                pids=pids,
                ecc_correctable=self._ecc(h, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0),
                ecc_uncorrectable=self._ecc(h, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                clock_mhz=num(clock),
                serial=self._serial.get(i),
                uuid=self._uuid.get(i),
                processes=names,
            )
            self._throttle(h, reading)
            out.append(reading)
        return out

    def devices(self) -> list[Reading]:
        return self.read()
