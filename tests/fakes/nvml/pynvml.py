"""Stand-in for nvidia-ml-py (`pynvml`) at the hardware boundary: replays a scripted trace."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import smi_trace as _trace

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_CLOCK_GRAPHICS = 0
NVML_CLOCK_SM = 1
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
NVML_ERROR_NOT_SUPPORTED = 3
nvmlClocksEventReasonSwPowerCap = 0x4
nvmlClocksEventReasonSwThermalSlowdown = 0x20


class NVMLError(Exception):
    def __init__(self, value=NVML_ERROR_NOT_SUPPORTED):
        super().__init__(value)
        self.value = value


_viol: dict = {}  # (device, policy) -> [reads, violation ns]


def nvmlInit():
    _trace.load()


def nvmlShutdown():
    pass


def nvmlDeviceGetCount():
    return len(_trace.devices())


def nvmlDeviceGetHandleByIndex(i):
    return i


def nvmlDeviceGetName(h):
    return _trace.devices()[h]["name"].encode()


def nvmlDeviceGetPciInfo(h):
    return SimpleNamespace(busId=_trace.devices()[h]["bdf"].upper().encode())


def nvmlDeviceGetMemoryInfo(h):
    total = int(_trace.devices()[h]["total"])
    used = _trace.used(h)
    return SimpleNamespace(total=total, used=used, free=total - used)


def nvmlDeviceGetUtilizationRates(h):
    return SimpleNamespace(gpu=_trace.devices()[h].get("activity", 0), memory=0)


def nvmlDeviceGetPowerUsage(h):
    return int(_trace.devices()[h].get("power", 0) * 1000)


def nvmlDeviceGetTemperature(h, sensor):
    return _trace.devices()[h].get("temp", 0)


def nvmlDeviceGetComputeRunningProcesses(h):
    return [
        SimpleNamespace(pid=p["pid"], usedGpuMemory=p["vram"])
        for p in _trace.devices()[h].get("processes", [])
    ]


def nvmlDeviceGetUUID(h):
    return _trace.devices()[h].get("uuid") or f"GPU-{h:08x}-0000-0000-0000-000000000000"


def nvmlDeviceGetSerial(h):
    serial = _trace.devices()[h].get("serial")
    if serial is None:
        raise NVMLError()
    return serial


def nvmlDeviceGetTotalEccErrors(h, error_type, counter_type):
    ecc = _trace.devices()[h].get("ecc")
    if ecc is None:
        raise NVMLError()  # ECC off or absent: NOT_SUPPORTED
    k = max(0, _trace.reads(h) - 1)
    now = ecc[min(k, len(ecc) - 1)] if isinstance(ecc, list) else ecc
    return sum(v[error_type] for v in now.values())


def nvmlDeviceGetClockInfo(h, clock_type):
    return _trace.devices()[h].get("clock", 1410)


def nvmlDeviceGetViolationStatus(h, policy):
    """Cumulative violation time (ns) over a reference clock (us): +100 ms of reference a read."""
    key = (h, policy)
    reads, ns = _viol.get(key, (0, 0))
    throttle = _trace.devices()[h].get("throttle") or {}
    if isinstance(throttle, list):
        throttle = throttle[min(reads, len(throttle) - 1)] if throttle else {}
    share = float(throttle.get("power" if policy == NVML_PERF_POLICY_POWER else "thermal", 0))
    ns += int(share * 100_000_000)
    reads += 1
    _viol[key] = (reads, ns)
    return SimpleNamespace(referenceTime=reads * 100_000, violationTime=ns)


def nvmlDeviceGetCurrentClocksEventReasons(h):
    throttle = _trace.devices()[h].get("throttle") or {}
    if isinstance(throttle, list):
        throttle = throttle[-1] if throttle else {}
    mask = 0
    if throttle.get("power"):
        mask |= nvmlClocksEventReasonSwPowerCap
    if throttle.get("thermal"):
        mask |= nvmlClocksEventReasonSwThermalSlowdown
    return mask


def nvmlSystemGetProcessName(pid):
    for d in _trace.devices():
        for p in d.get("processes", []):
            if p["pid"] == pid and p.get("name"):
                return p["name"].encode()
    raise NVMLError()
