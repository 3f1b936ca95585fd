"""Stand-in for AMD's `amdsmi` package at the hardware boundary: replays a scripted VRAM trace.

Placed first on PYTHONPATH, pyrsmi (which prefers the amdsmi package) runs its real code over it.
"""

from __future__ import annotations

import enum
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import smi_trace as _trace


class AmdSmiException(Exception):
    pass


class AmdSmiInitFlags(enum.IntEnum):
    INIT_ALL_PROCESSORS = 0
    INIT_AMD_GPUS = 1


class AmdSmiMemoryType(enum.IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiTemperatureType(enum.IntEnum):
    EDGE = 0
    HOTSPOT = 1


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


_inited = False


def amdsmi_init(flag=AmdSmiInitFlags.INIT_AMD_GPUS):
    global _inited
    _trace.load()
    _inited = True


def amdsmi_shut_down():
    global _inited
    _inited = False


def _dev(h: int) -> dict:
    if not _inited:
        raise AmdSmiException("not initialised")
    return _trace.devices()[h]


def amdsmi_get_processor_handles():
    if not _inited:
        raise AmdSmiException("not initialised")
    return list(range(len(_trace.devices())))


def amdsmi_get_gpu_asic_info(h):
    d = _dev(h)
    return {"market_name": d["name"], "device_id": "0x74a1", "rev_id": "0x00"}


def amdsmi_get_gpu_memory_usage(h, mem_type):
    _dev(h)
    return _trace.used(h) if mem_type == AmdSmiMemoryType.VRAM else 0


def amdsmi_get_gpu_memory_total(h, mem_type):
    return int(_dev(h)["total"]) if mem_type == AmdSmiMemoryType.VRAM else 0


def amdsmi_get_gpu_activity(h):
    return {"gfx_activity": _dev(h).get("activity", 0), "umc_activity": 0, "mm_activity": 0}


def amdsmi_get_power_info(h):
    return {"current_socket_power": _dev(h).get("power", 0), "average_socket_power": _dev(h).get("power", 0)}


def amdsmi_get_gpu_device_bdf(h):
    return _dev(h)["bdf"]


def amdsmi_get_temp_metric(h, sensor, metric):
    return _dev(h).get("temp", 0)


def amdsmi_get_gpu_process_list(h):
    return [{"pid": p["pid"], "memory_usage": {"vram_mem": p["vram"]}} for p in _dev(h).get("processes", [])]
