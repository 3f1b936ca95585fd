"""AMD GPUs through pyrsmi (`pyrsmi.rocml`), with the `amdsmi` package for what pyrsmi lacks.

pyrsmi gives count, name, VRAM used/total and utilisation; `amdsmi`, when it imports, adds the PCI
bus id, the temperatures, power, ECC counts, throttle residency, clocks, partition modes and
per-process VRAM. Without ROCm `import amdsmi` raises a KeyError (not an ImportError) and pyrsmi
raises ROCMLError_LibraryNotFound: both mean "absent". docs/telemetry.md says where each behaviour
was read.
"""

from __future__ import annotations

import contextlib
import importlib
import time
from typing import Any

from tunedeck.telemetry.base import BackendAbsent, Reading, no_devices, norm_bus_id, num


def _amdsmi() -> Any | None:
    try:  # by name: ROCm ships the module, no wheel of ours names it (PyPI's breaks `import ray`)
        return importlib.import_module("amdsmi")
    except Exception:
        return None


def _text(v: Any) -> str | None:
    """A string the library answered, or None for its "N/A" and empty answers."""
    if v is None:
        return None
    s = (v.decode(errors="replace") if isinstance(v, bytes) else str(v)).strip()
    return None if not s or s.upper() in ("N/A", "NA") else s


def _top(v: Any) -> float | None:
    """A reading or the largest of a list of them (per-XCC clocks, per-stack HBM temperatures);
    "N/A" entries are skipped."""
    if isinstance(v, (list, tuple)):
        found = [x for x in map(num, v) if x is not None]
        return max(found) if found else None
    return num(v)


KB = 1024  # the metrics table counts xGMI data in KB ("KiloBytes" in the kernel's gpu_metrics_v1_4)


def link_bytes(v: Any) -> int | None:
    """Bytes over every xGMI link that answers, from one of the metrics table's per-link lists of
    accumulated KB (`xgmi_read_data_acc`, `xgmi_write_data_acc`): an entry the driver does not fill
    is "N/A" (its maximum integer), and so is the whole field on a part whose table lacks it (MI200).
    None when no link answers: "no reading", never 0."""
    found = [x for x in map(num, v if isinstance(v, (list, tuple)) else [v]) if x is not None]
    return int(sum(found)) * KB if found else None


def card_power(info: Any) -> float | None:
    """Watts from amdsmi_get_power_info: the current socket power where the part has it (MI300
    series; its average is N/A), else the average (MI200 and older; its current is N/A). The
    library answers "N/A" (a string) for a field the part lacks, and comparing that string with a
    number raises: each field is read on its own (pyrsmi 1.1 compares them and answers -1 for every
    MI250 GCD). None when neither holds a reading (the secondary die of an MI250X)."""
    if not isinstance(info, dict):
        return None
    for key in ("current_socket_power", "average_socket_power", "socket_power"):
        w = num(info.get(key))
        if w:  # 0 is what an older library answers for a field the part does not report
            return w
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
        self._serial: dict[int, str | None] = {}
        self._uuid: dict[int, str | None] = {}
        self._partition: dict[int, str | None] = {}
        self._shared: dict[int, int] = {}  # device -> the device whose power reading covers it
        self._ecc_seen: dict[int, tuple[int | None, int | None]] = {}
        self._blocks: dict[int, dict[str, tuple[int, int]]] = {}

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
            raise no_devices("pyrsmi", "AMD")
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
            board = self._amd_call("amdsmi_get_gpu_board_info", i)
            self._serial[i] = _text(board.get("product_serial")) if isinstance(board, dict) else None
            self._uuid[i] = _text(self._amd_call("amdsmi_get_gpu_device_uuid", i))
            modes = [
                _text(self._amd_call(fn, i))
                for fn in ("amdsmi_get_gpu_compute_partition", "amdsmi_get_gpu_memory_partition")
            ]
            self._partition[i] = "/".join(m for m in modes if m) or None
        self._shared = self._power_sharing(n)

    def _power_sharing(self, n: int) -> dict[int, int]:
        """Which devices report N/A power because another die of the same card reports the card's
        whole power (MI250/MI250X: two GCDs a card, each enumerated as a GPU). The dies of a card share
        its board serial; where the library gives none, an MI250's dies are enumerated in pairs."""
        cards: dict[Any, list[int]] = {}
        for i in range(n):
            key: Any = self._serial.get(i)
            if key is None:
                if "MI250" not in (self._names.get(i) or ""):
                    continue
                key = ("pair", i // 2)
            cards.setdefault(key, []).append(i)
        shared: dict[int, int] = {}
        for dies in cards.values():
            if len(dies) < 2:
                continue
            reporting = [i for i in dies if self._power(i) is not None]
            if reporting:
                shared |= {i: reporting[0] for i in dies if i not in reporting}
        return shared

    def _amd_call(self, fn: str, i: int, *args: Any) -> Any:
        if self._amd is None or i >= len(self._handles):
            return None
        try:
            return getattr(self._amd, fn)(self._handles[i], *args)
        except Exception:  # AmdSmiLibraryException: NOT_SUPPORTED on this part, or a transient error
            return None

    def close(self) -> None:
        if self._rocml is not None:
            with contextlib.suppress(Exception):
                self._rocml.smi_shutdown()
        self._rocml = None

    def _temp(self, i: int, sensor: str) -> float | None:
        amd = self._amd
        if amd is None:
            return None
        try:
            kind = getattr(amd.AmdSmiTemperatureType, sensor)
            metric = amd.AmdSmiTemperatureMetric.CURRENT
        except Exception:
            return None
        return num(self._amd_call("amdsmi_get_temp_metric", i, kind, metric))

    def _power(self, i: int) -> float | None:
        if self._amd is not None:
            return card_power(self._amd_call("amdsmi_get_power_info", i))
        return num(self._rocml.smi_get_device_average_power(i)) or None

    def _processes(self, i: int) -> tuple[dict[int, int], dict[int, str]]:
        vram: dict[int, int] = {}
        names: dict[int, str] = {}
        for p in self._amd_call("amdsmi_get_gpu_process_list", i) or ():
            try:
                pid = int(p["pid"])
                vram[pid] = int(p["memory_usage"]["vram_mem"])
            except Exception:
                continue
            if name := _text(p.get("name")):
                names[pid] = name
        return vram, names

    def _ecc(self, i: int) -> tuple[int | None, int | None, dict[str, tuple[int, int]]]:
        """Totals each reading; the per-block counts only when a total moved (they are many calls)."""
        total = self._amd_call("amdsmi_get_gpu_total_ecc_count", i)
        if not isinstance(total, dict):
            return None, None, {}
        ce, ue = num(total.get("correctable_count")), num(total.get("uncorrectable_count"))
        now = (None if ce is None else int(ce), None if ue is None else int(ue))
        if self._ecc_seen.get(i) != now:
            self._ecc_seen[i] = now
            self._blocks[i] = self._ecc_blocks(i) if (now[0] or now[1]) else {}
        return now[0], now[1], self._blocks.get(i, {})

    def _ecc_blocks(self, i: int) -> dict[str, tuple[int, int]]:
        amd = self._amd
        enabled = self._amd_call("amdsmi_get_gpu_ecc_enabled", i)
        out: dict[str, tuple[int, int]] = {}
        try:
            blocks = [b for b in amd.AmdSmiGpuBlock if b.name not in ("INVALID", "RESERVED")]
        except Exception:
            return out
        for b in blocks:
            if isinstance(enabled, int) and not enabled & int(b):
                continue
            c = self._amd_call("amdsmi_get_gpu_ecc_count", i, b)
            if isinstance(c, dict):
                ce, ue = num(c.get("correctable_count")), num(c.get("uncorrectable_count"))
                if ce or ue:
                    out[b.name] = (int(ce or 0), int(ue or 0))
        return out

    def _metrics(self, i: int, r: Reading) -> None:
        """One amdsmi_get_gpu_metrics_info call: HBM stack temperatures, the graphics clock, the
        cumulative throttle residency counters and the cumulative xGMI traffic per link (both MI300
        series: MI200 answers N/A). The residency is read here, not through
        amdsmi_get_violation_status, which waits 100 ms inside every call."""
        m = self._amd_call("amdsmi_get_gpu_metrics_info", i)
        if not isinstance(m, dict):
            return
        hbm = _top(m.get("temperature_hbm"))
        if hbm is not None:
            r.temp_hbm_c = max(hbm, r.temp_hbm_c or hbm)
        if r.temp_junction_c is None:
            r.temp_junction_c = num(m.get("temperature_hotspot"))
        r.clock_mhz = num(m.get("current_gfxclk")) or _top(m.get("current_gfxclks"))
        clock = num(m.get("accumulation_counter"))
        acc = {
            kind: v
            for kind, key in (
                ("power", "ppt_residency_acc"),
                ("thermal", "socket_thm_residency_acc"),
                ("hbm_thermal", "hbm_thm_residency_acc"),
            )
            if (v := num(m.get(key))) is not None
        }
        if clock is not None and acc:
            r.throttle_clock, r.throttle_acc = clock, acc
        r.xgmi_read_bytes = link_bytes(m.get("xgmi_read_data_acc"))
        r.xgmi_write_bytes = link_bytes(m.get("xgmi_write_data_acc"))
        if r.xgmi_read_bytes is not None or r.xgmi_write_bytes is not None:
            # The counters' time: the driver's timestamp of this table (ns) where it has one.
            ns = num(m.get("system_clock_counter"))
            r.xgmi_clock = ns / 1e9 if ns else time.monotonic()

    def read(self, indices: list[int] | None = None) -> list[Reading]:
        r = self._rocml
        out = []
        for i in indices if indices is not None else sorted(self._names):
            used = num(r.smi_get_device_memory_used(i))
            if used is None:
                continue
            vram, names = self._processes(i)
            ce, ue, blocks = self._ecc(i)
            reading = Reading(
                index=i,
                name=self._names.get(i),
                used_bytes=int(used),
                total_bytes=self._totals.get(i),
                util=num(r.smi_get_device_utilization(i)),
                power_w=self._power(i),
                temp_c=self._temp(i, "EDGE"),
                bus_id=self._bus.get(i),
                pids=vram,
                temp_junction_c=self._temp(i, "HOTSPOT"),
                temp_hbm_c=self._temp(i, "VRAM"),
                power_shared_with=self._shared.get(i),
                ecc_correctable=ce,
                ecc_uncorrectable=ue,
                ecc_blocks=blocks,
                partition=self._partition.get(i),
                serial=self._serial.get(i),
                uuid=self._uuid.get(i),
                processes=names,
            )
            if reading.power_shared_with is not None:
                reading.power_w = None  # the card's whole power is on the die it is shared with
            self._metrics(i, reading)
            if reading.clock_mhz is None and self._amd is not None:
                with contextlib.suppress(Exception):
                    clk = self._amd_call("amdsmi_get_clock_info", i, self._amd.AmdSmiClkType.GFX)
                    reading.clock_mhz = num(clk.get("clk")) if isinstance(clk, dict) else None
            out.append(reading)
        return out

    def devices(self) -> list[Reading]:
        return self.read()
