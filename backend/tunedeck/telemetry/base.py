"""What every telemetry backend reports: one reading per device per poll."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class BackendAbsent(Exception):
    """The library is missing or cannot reach a device; the message says why."""


# How a library that loaded says it sees no device (telemetry.absence tells it from a missing library).
NO_DEVICES = "GPU found"


def no_devices(library: str, vendor: str) -> BackendAbsent:
    return BackendAbsent(f"{library}: no {vendor} {NO_DEVICES}")


@dataclass
class Reading:
    index: int  # device index on the node (SMI order); -1 = host memory
    name: str | None
    used_bytes: int
    total_bytes: int | None = None
    util: float | None = None
    power_w: float | None = None
    temp_c: float | None = None  # the edge sensor (MI300-series parts have none: junction and HBM below)
    bus_id: str | None = None
    pids: dict[int, int] = field(default_factory=dict)  # pid -> bytes, where the library tells
    temp_junction_c: float | None = None  # hotspot / junction
    temp_hbm_c: float | None = None  # the hottest HBM stack (or the VRAM sensor)
    # The device whose power reading covers this one (an MI250X's secondary GCD reports N/A while the
    # primary reports the whole card): its own power is then None, never a guess, never a sum.
    power_shared_with: int | None = None
    ecc_correctable: int | None = None  # totals over every block since the driver loaded
    ecc_uncorrectable: int | None = None
    ecc_blocks: dict[str, tuple[int, int]] = field(
        default_factory=dict
    )  # block -> (correctable, uncorrectable), non-zero only
    # Cumulative throttle residency counters (same unit as throttle_clock): "power", "thermal", "hbm_thermal".
    # A share of time needs two readings (throttle_shares).
    throttle_acc: dict[str, float] = field(default_factory=dict)
    throttle_clock: float | None = None
    throttle_reasons: list[str] = field(default_factory=list)  # what the library says is active now
    clock_mhz: float | None = None  # current graphics (SM) clock
    # Cumulative xGMI traffic, bytes, summed over the links that answer (None: no link does, as on
    # MI200, whose metrics table has no such counters), and the time they were read in seconds (the
    # metrics table's driver timestamp where it has one): a rate needs two readings (xgmi_rates).
    xgmi_read_bytes: int | None = None
    xgmi_write_bytes: int | None = None
    xgmi_clock: float | None = None
    partition: str | None = None  # e.g. "CPX/NPS4" (MI300X compute / memory partition modes)
    serial: str | None = None
    uuid: str | None = None
    processes: dict[int, str] = field(default_factory=dict)  # pid -> process name, where the library tells


THROTTLE_KINDS = ("power", "thermal", "hbm_thermal")


def throttle_shares(now: Reading, before: Reading | None) -> dict[str, float]:
    """The share of time (0..1) each throttle kind was active between two readings of one device,
    from the library's cumulative residency counters (what amdsmi_get_violation_status computes
    over its own 100 ms wait, and NVML's violation time over its reference clock). Empty when either
    reading lacks them or the clock did not move; a counter that went back (a driver reload) is no share."""
    if before is None or now.throttle_clock is None or before.throttle_clock is None:
        return {}
    span = now.throttle_clock - before.throttle_clock
    if span <= 0:
        return {}
    out = {}
    for k, v in now.throttle_acc.items():
        b = before.throttle_acc.get(k)
        if b is not None and v >= b:
            out[k] = min(1.0, (v - b) / span)
    return out


XGMI_DIRECTIONS = ("read", "write")


def xgmi_rates(now: Reading, before: Reading | None) -> dict[str, float]:
    """Bytes per second over each direction's xGMI links between two readings of one device, from the
    cumulative counters. Empty when either reading lacks a time or the time did not move; a direction
    whose counter is missing from either reading, or went back (a driver reload restarts it), is left
    out: no rate is better than a false one."""
    if before is None or now.xgmi_clock is None or before.xgmi_clock is None:
        return {}
    span = now.xgmi_clock - before.xgmi_clock
    if span <= 0:
        return {}
    out = {}
    for d in XGMI_DIRECTIONS:
        v, b = getattr(now, f"xgmi_{d}_bytes"), getattr(before, f"xgmi_{d}_bytes")
        if v is not None and b is not None and v >= b:
            out[d] = (v - b) / span
    return out


# A sample this far above the one before it is a rise worth sending and judging at once.
RISE_BYTES = 1 << 30
RISE_SHARE = 0.05


def rise_floor(total: float | None) -> float:
    """How far above the last sample a device's reading is a rise: RISE_BYTES or RISE_SHARE of it."""
    return max(RISE_BYTES, RISE_SHARE * (total or 0))


def num(v, scale: float = 1.0) -> float | None:
    """SMI getters answer -1 (or raise) for "unknown": both become None, and so does a NaN or an
    infinity (the server refuses a batch that holds one)."""
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError):
        return None
    return None if not math.isfinite(f) or f < 0 else f * scale


def norm_bus_id(v) -> str | None:
    """PCI bus ids as 'dddd:bb:dd.f' lower case, whatever the library's spelling."""
    if v is None:
        return None
    if isinstance(v, bytes):
        v = v.decode(errors="replace")
    if isinstance(v, int):
        if v < 0:
            return None
        return f"{(v >> 32) & 0xFFFFFFFF:04x}:{(v >> 8) & 0xFF:02x}:{(v >> 3) & 0x1F:02x}.{v & 0x7:x}"
    s = str(v).strip().lower()
    parts = s.replace(".", ":").split(":")
    try:
        if len(parts) == 4:  # NVML gives an 8-digit domain
            return f"{int(parts[0], 16):04x}:{int(parts[1], 16):02x}:{int(parts[2], 16):02x}.{int(parts[3], 16):x}"
        if len(parts) == 3:
            return f"0000:{int(parts[0], 16):02x}:{int(parts[1], 16):02x}.{int(parts[2], 16):x}"
    except ValueError:
        return None
    return None


def process_name(pid: int) -> str | None:
    """A process's name from the host (the SMI's own name where it gives one wins)."""
    try:
        import psutil

        return psutil.Process(pid).name()
    except Exception:
        return None


def node_fields(r: Reading, before: Reading | None = None) -> dict:
    """A reading as the nodes page shows a GPU (schemas.NodeGpu, less its holder): power (or whose
    power covers it), every temperature the part has, ECC, throttle, clock, partition, identity and
    the processes on it. `before`: the same device's previous reading, for throttle shares and xGMI
    rates."""
    pids = sorted(set(r.pids) | set(r.processes))
    rates = xgmi_rates(r, before)
    return {
        "index": r.index,
        "name": r.name,
        "bus_id": r.bus_id,
        "total_bytes": r.total_bytes,
        "used_bytes": r.used_bytes,
        "util": r.util,
        "power_w": r.power_w,
        "power_shared_with": r.power_shared_with,
        "temp_c": r.temp_c,
        "temp_junction_c": r.temp_junction_c,
        "temp_hbm_c": r.temp_hbm_c,
        "clock_mhz": r.clock_mhz,
        "ecc_correctable": r.ecc_correctable,
        "ecc_uncorrectable": r.ecc_uncorrectable,
        "ecc_blocks": {b: list(v) for b, v in r.ecc_blocks.items()},
        "throttle": throttle_shares(r, before),
        "throttle_reasons": list(r.throttle_reasons),
        "xgmi_read_bytes": r.xgmi_read_bytes,
        "xgmi_write_bytes": r.xgmi_write_bytes,
        "xgmi_read_bytes_per_s": rates.get("read"),
        "xgmi_write_bytes_per_s": rates.get("write"),
        "partition": r.partition,
        "serial": r.serial,
        "uuid": r.uuid,
        "processes": [
            {"pid": p, "name": r.processes.get(p) or process_name(p), "vram_bytes": r.pids.get(p)}
            for p in pids
        ],
    }
