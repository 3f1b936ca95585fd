"""Stand-in for nvidia-ml-py (`pynvml`) at the hardware boundary: replays a scripted trace."""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import smi_trace as _trace

NVML_TEMPERATURE_GPU = 0


class NVMLError(Exception):
    pass


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
