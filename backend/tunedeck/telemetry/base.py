"""What every telemetry backend reports: one reading per device per poll."""

from __future__ import annotations

import math
from dataclasses import dataclass, field


class BackendAbsent(Exception):
    """The library is missing or cannot reach a device; the message says why."""


@dataclass
class Reading:
    index: int  # device index on the node (SMI order); -1 = host memory
    name: str | None
    used_bytes: int
    total_bytes: int | None = None
    util: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    bus_id: str | None = None
    pids: dict[int, int] = field(default_factory=dict)  # pid -> bytes, where the library tells


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
