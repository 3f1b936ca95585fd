"""Stand-in for AMD's `amdsmi` package at the hardware boundary: replays a scripted trace.

Placed first on PYTHONPATH, pyrsmi (which prefers the amdsmi package) runs its real code over it.
It answers as the real module does (py-interface/amdsmi_interface.py): dicts whose unsupported fields
hold the string "N/A", and AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED) for a sensor or a call
the part lacks. A trace device's "gen" picks what a generation answers:

- "MI250X": each GCD is a device of its own; power only as `average_socket_power` (current: N/A), and
  the secondary die (trace "power": null) N/A in both; edge, junction and memory sensors; no throttle
  residency counters; no partition modes; no xGMI data counters (its metrics table, gpu_metrics v1_3,
  has none: each of the 8 link entries answers "N/A"). The two dies of a card share the board serial ("serial").
- "MI300X": no edge sensor (NOT_SUPPORTED); power only as `current_socket_power` (average: N/A);
  junction and HBM temperatures (per-stack list in the metrics table); per-XCC clocks; cumulative
  throttle residency counters; compute and memory partition modes ("partition": ["CPX", "NPS4"]);
  cumulative xGMI read/write data per link (gpu_metrics v1_4: 8 links, in KB), where the trace says.
- no "gen": every field answers (the traces written before generations were told apart).

Every metrics table carries `system_clock_counter`, the driver's timestamp (ns): one second of device
time a metrics read here, so rates over it are exact.

Other trace keys: "temp" (edge), "temp_junction", "temp_hbm" (list of stacks), "clock" (MHz),
"throttle" (a dict, or a list of them one per metrics read: {"power"|"thermal"|"hbm_thermal": share}),
"ecc" (a dict block -> [correctable, uncorrectable], or a list of them, one per memory read),
"uuid", "serial", "processes" [{"pid", "vram", "name"}], "xgmi" ({"read"|"write": [KB each link's
counter grows a metrics read, one entry per link, up to 8; null: that link answers "N/A"]}; without it
every link answers "N/A"), "xgmi_reload" (the metrics read, counted from 0, at which the driver has
reloaded: the counters read zero there and grow again after).
"""

from __future__ import annotations

import enum
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import smi_trace as _trace

NA = "N/A"
AMDSMI_STATUS_NOT_SUPPORTED = 2


class AmdSmiException(Exception):
    pass


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code):
        super().__init__(err_code)
        self.err_code = abs(err_code)

    def get_error_code(self):
        return self.err_code


def _unsupported():
    raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)


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
    JUNCTION = 1
    VRAM = 2
    HBM_0 = 3
    HBM_1 = 4
    HBM_2 = 5
    HBM_3 = 6


class AmdSmiTemperatureMetric(enum.IntEnum):
    CURRENT = 0


class AmdSmiClkType(enum.IntEnum):
    SYS = 0
    GFX = 0
    DF = 1


class AmdSmiGpuBlock(enum.IntEnum):  # bit flags, as amdsmi_get_gpu_ecc_enabled's mask
    INVALID = 0
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    ATHUB = 16
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128
    DF = 256
    SMN = 512
    SEM = 1024
    MP0 = 2048
    MP1 = 4096
    FUSE = 8192
    MCA = 16384


_inited = False
_metric_reads: dict[int, int] = {}
_residency: dict[int, dict[str, float]] = {}
_xgmi: dict[int, dict[str, list[int]]] = {}
XGMI_LINKS = 8  # AMDSMI_MAX_NUM_XGMI_LINKS, the kernel's NUM_XGMI_LINKS


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


def _gen(h: int) -> str | None:
    return _dev(h).get("gen")


def _or_na(v):
    return NA if v is None else v


def amdsmi_get_processor_handles():
    if not _inited:
        raise AmdSmiException("not initialised")
    return list(range(len(_trace.devices())))


def amdsmi_get_gpu_asic_info(h):
    d = _dev(h)
    return {
        "market_name": d["name"],
        "device_id": "0x74a1",
        "rev_id": "0x00",
        "asic_serial": d.get("asic_serial", NA),
    }


def amdsmi_get_gpu_board_info(h):
    d = _dev(h)
    return {
        "model_number": NA,
        "product_serial": d.get("serial") or NA,
        "fru_id": NA,
        "product_name": d["name"],
    }


def amdsmi_get_gpu_device_uuid(h):
    return _dev(h).get("uuid") or ""


def amdsmi_get_gpu_memory_usage(h, mem_type):
    _dev(h)
    return _trace.used(h) if mem_type == AmdSmiMemoryType.VRAM else 0


def amdsmi_get_gpu_memory_total(h, mem_type):
    return int(_dev(h)["total"]) if mem_type == AmdSmiMemoryType.VRAM else 0


def amdsmi_get_gpu_activity(h):
    return {"gfx_activity": _dev(h).get("activity", 0), "umc_activity": 0, "mm_activity": 0}


def amdsmi_get_power_info(h):
    d, gen = _dev(h), _gen(h)
    power = d.get("power", 0)
    if gen == "MI250X":
        current, average = NA, _or_na(power)
    elif gen == "MI300X":
        current, average = _or_na(power), NA
    else:
        current = average = power
    return {
        "current_socket_power": current,
        "average_socket_power": average,
        "gfx_voltage": NA,
        "soc_voltage": NA,
        "mem_voltage": NA,
        "power_limit": d.get("power_limit", 750 if gen == "MI300X" else 560),
    }


def amdsmi_get_gpu_device_bdf(h):
    return _dev(h)["bdf"]


def amdsmi_get_temp_metric(h, sensor, metric):
    d, gen = _dev(h), _gen(h)
    if sensor == AmdSmiTemperatureType.EDGE:
        if gen == "MI300X":
            _unsupported()  # MI300-series parts have no edge sensor
        return d.get("temp", 0)
    if sensor == AmdSmiTemperatureType.HOTSPOT:
        return d["temp_junction"] if "temp_junction" in d else _unsupported()
    if sensor == AmdSmiTemperatureType.VRAM:
        hbm = d.get("temp_hbm")
        return max(hbm) if hbm else _unsupported()
    _unsupported()


def _at(v, k: int):
    """A trace value that may be a list over reads (the last one holds)."""
    if isinstance(v, list):
        return v[max(0, min(k, len(v) - 1))] if v else None
    return v


def amdsmi_get_gpu_metrics_info(h):
    d, gen = _dev(h), _gen(h)
    k = _metric_reads.get(h, 0)
    _metric_reads[h] = k + 1
    hbm = d.get("temp_hbm") or []
    out = {
        "temperature_edge": NA if gen == "MI300X" else d.get("temp", NA),
        "temperature_hotspot": d.get("temp_junction", NA),
        "temperature_mem": max(hbm) if hbm else NA,
        "temperature_hbm": [*hbm, *[NA] * (4 - len(hbm))] if gen == "MI300X" else [NA] * 4,
        "average_socket_power": amdsmi_get_power_info(h)["average_socket_power"],
        "current_socket_power": amdsmi_get_power_info(h)["current_socket_power"],
        "current_gfxclk": NA if gen == "MI300X" else d.get("clock", NA),
        "current_gfxclks": [d.get("clock", NA), *[NA] * 7] if gen == "MI300X" else [NA] * 8,
        "throttle_status": NA,
    }
    out["system_clock_counter"] = 1_000_000_000 * (k + 1)
    out |= _xgmi_acc(h, d, gen, k)
    keys = {
        "power": "ppt_residency_acc",
        "thermal": "socket_thm_residency_acc",
        "hbm_thermal": "hbm_thm_residency_acc",
    }
    if gen == "MI250X":  # MI3xx only (AMD's Device Metrics Exporter lists the violation metrics so)
        out |= {"accumulation_counter": NA, "prochot_residency_acc": NA, **dict.fromkeys(keys.values(), NA)}
        return out
    # The firmware's counters: +100 ticks a read here, each kind's residency by its scripted share.
    acc = _residency.setdefault(h, dict.fromkeys(keys, 0.0))
    shares = _at(d.get("throttle"), k) or {}
    for kind in keys:
        acc[kind] += 100 * float(shares.get(kind, 0))
    out["accumulation_counter"] = 100 * (k + 1)
    out["prochot_residency_acc"] = 0
    out |= {key: int(acc[kind]) for kind, key in keys.items()}
    return out


def _xgmi_acc(h: int, d: dict, gen: str | None, k: int) -> dict:
    """The per-link accumulated xGMI data (KB) of the k-th metrics read: each scripted link grows by
    its amount a read; a link the trace leaves null (or past its list) answers "N/A", as amdsmi turns
    an entry the driver left at its maximum into "N/A"."""
    spec = d.get("xgmi")
    if gen == "MI250X" or not spec:
        return {"xgmi_read_data_acc": [NA] * XGMI_LINKS, "xgmi_write_data_acc": [NA] * XGMI_LINKS}
    reload = d.get("xgmi_reload") == k  # the driver reloads: its counters start again from zero
    if reload:
        _xgmi.pop(h, None)
    acc = _xgmi.setdefault(h, {"read": [0] * XGMI_LINKS, "write": [0] * XGMI_LINKS})
    out = {}
    for direction in ("read", "write"):
        links = [*(spec.get(direction) or []), *[None] * XGMI_LINKS][:XGMI_LINKS]
        for j, kb in enumerate(links):
            if kb is not None and not reload:
                acc[direction][j] += int(kb)
        out[f"xgmi_{direction}_data_acc"] = [
            NA if kb is None else acc[direction][j] for j, kb in enumerate(links)
        ]
    return out


def amdsmi_get_clock_info(h, clock_type):
    clk = _dev(h).get("clock")
    if clk is None:
        _unsupported()
    return {"clk": clk, "min_clk": 500, "max_clk": 2100, "clk_locked": False, "clk_deep_sleep": False}


def _ecc_now(h: int) -> dict:
    k = max(0, _trace.reads(h) - 1)  # the device's memory reads so far: ECC events land mid-trace
    return _at(_dev(h).get("ecc"), k) or {}


def amdsmi_get_gpu_total_ecc_count(h):
    blocks = _ecc_now(h)
    return {
        "correctable_count": sum(v[0] for v in blocks.values()),
        "uncorrectable_count": sum(v[1] for v in blocks.values()),
        "deferred_count": 0,
    }


def amdsmi_get_gpu_ecc_enabled(h):
    mask = 0
    for b in (AmdSmiGpuBlock.UMC, AmdSmiGpuBlock.SDMA, AmdSmiGpuBlock.GFX, AmdSmiGpuBlock.MMHUB):
        mask |= int(b)
    return mask


def amdsmi_get_gpu_ecc_count(h, block):
    ce, ue = _ecc_now(h).get(AmdSmiGpuBlock(block).name, (0, 0))
    return {"correctable_count": ce, "uncorrectable_count": ue, "deferred_count": 0}


def amdsmi_get_gpu_compute_partition(h):
    part = _dev(h).get("partition")
    return part[0] if part else _unsupported()


def amdsmi_get_gpu_memory_partition(h):
    part = _dev(h).get("partition")
    return part[1] if part else _unsupported()


def amdsmi_get_violation_status(h):
    raise AssertionError("amdsmi_get_violation_status waits 100 ms inside every call: not in a sampling loop")


def amdsmi_get_gpu_process_list(h):
    return [
        {
            "name": p.get("name", NA),
            "pid": p["pid"],
            "mem": p["vram"],
            "engine_usage": {"gfx": 0, "enc": 0},
            "memory_usage": {"gtt_mem": 0, "cpu_mem": 0, "vram_mem": p["vram"]},
        }
        for p in _dev(h).get("processes", [])
    ]
