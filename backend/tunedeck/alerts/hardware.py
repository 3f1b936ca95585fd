"""Detectors over the hardware readings of a job's GPUs: ECC errors that rise during the job, and
throttling that costs the job its tokens/s.

Each device keeps bounded state (counters, the last values, a fixed-length window of throttle
samples) and consumes its samples in time order, in chunks of any size; a sample at or before the
newest one it has is skipped (a resend). The tokens/s come from the job's points. What is found does
not depend on how the samples or the points were chunked, nor on their interleaving: the throttle
finding is judged over the kept windows when findings are read.

- `gpu_ecc_uncorrectable` (critical): the uncorrectable count rose above the one the job's first
  sample saw. Names the GPU, its node and the blocks the errors are in.
- `gpu_ecc_correctable` (warning): at least CE_FAST correctable errors within CE_WINDOW_S.
- `gpu_throttle` (warning): while the job's tokens/s stood THROTTLE_DROP below its best, the GPU
  spent at least THROTTLE_SHARE of the THROTTLE_WINDOW_S before held down by its power or thermal
  limits; the evidence says the residency, the clock and the drop.
- `throughput_drop` (warning): a GPU job's tokens/s stood DROP below its best for DROP_POINTS points
  in a row, and no throttling explains it (gpu_throttle names that cause instead); says when it began.
  A CPU job's tokens/s follow whatever else the host runs: not judged.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from tunedeck.alerts.series import Finding, Judging, Occurrences, Point, median

CE_FAST = 10  # correctable errors ...
CE_WINDOW_S = 600.0  # ... within this long: rising fast
THROTTLE_SHARE = 0.2  # a real share of the time throttled
THROTTLE_DROP = 0.15  # tokens/s this far below the run's best
THROTTLE_WINDOW_S = 60.0  # the throttle residency before a point, that point's tokens/s judged against
RATE_MEDIAN = 5  # points in the tokens/s median (one noisy point is no drop)
KEPT = 4096  # throttle samples and tokens/s points kept (hours of a run at one sample a second)
DROP = 0.3  # tokens/s this far below the run's best (a median of RATE_MEDIAN points against the best one) ...
DROP_POINTS = 10  # ... for this many points in a row: a slowdown that lasts, not an eval or a save
KINDS = ("gpu_ecc_uncorrectable", "gpu_ecc_correctable", "gpu_throttle", "throughput_drop")
COLUMNS = (
    "ecc_correctable",
    "ecc_uncorrectable",
    "ecc_blocks",
    "throttle_power",
    "throttle_thermal",
    "throttle_hbm",
    "clock_mhz",
)


def medians(rt: np.ndarray, ry: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each point's rolling median of tokens/s (RATE_MEDIAN points ending there), its time, and the
    best median before it (NaN at the first): what a drop is judged against."""
    med = np.sort(np.lib.stride_tricks.sliding_window_view(ry, RATE_MEDIAN), axis=1)[:, RATE_MEDIAN // 2]
    return rt[RATE_MEDIAN - 1 :], med, np.concatenate([[np.nan], np.maximum.accumulate(med)[:-1]])


def where(gpu: int, node: str) -> str:
    return f"GPU {gpu} on {node}" if node else f"GPU {gpu}"


def blocks_with(text: str | None, which: int) -> list[tuple[str, int]]:
    """(block, count) from an `ecc_blocks` text (`UMC=5/2,GFX=1/0`): which 0 = correctable, 1 = not."""
    out = []
    for part in (text or "").split(","):
        name, _, counts = part.partition("=")
        try:
            n = int(counts.split("/")[which])
        except (IndexError, ValueError):
            continue
        if n:
            out.append((name.strip(), n))
    return sorted(out, key=lambda x: -x[1])  # the most errors first


SMALL = 64  # samples fed one by one; more go as columns


def _value(c: Sequence[Any] | None, i: int) -> float | None:
    """A column's value as a float, None for none (a NaN too)."""
    if c is None:
        return None
    v = c[i]
    return None if v is None or v != v else float(v)


class Device:
    """One GPU's hardware readings, as the job saw them."""

    def __init__(self, gpu: int, node: str = ""):
        self.gpu, self.node = gpu, node
        self.t_last: float | None = None
        self.ue_first: int | None = None  # the uncorrectable count of the job's first reading
        self.ue: int | None = None
        self.ue_rises = Occurrences()
        self.ce_first: int | None = None
        self.ce: int | None = None
        self.ce_changes: deque[tuple[float, int]] = deque()  # (t, count) of the changes in the window
        self.ce_before = 0  # the count before the window's first change
        self.ce_fast = Occurrences()
        self.ce_fast_n = 0  # errors in the window when last found fast
        self.blocks: str | None = None  # the newest per-block counts
        self.t = deque[float](maxlen=KEPT)
        self.power = deque[float](maxlen=KEPT)  # share of each interval held by power limits
        self.thermal = deque[float](maxlen=KEPT)  # ... by thermal (or HBM thermal) limits
        self.clock = deque[float](maxlen=KEPT)  # NaN: none read
        self.clock_top: float | None = None

    def feed(self, t: Sequence[float], cols: Mapping[str, Sequence[Any] | None]) -> None:
        """Samples of this device in time order: `t` and any of COLUMNS, one value a sample. A few (a
        live batch) one by one; many (a state built from the stored series) as whole columns, with a
        Python step per sample only where an ECC count moved. Both give the same state."""
        if len(t) <= SMALL:
            self._feed_few(t, cols)
            return
        tt = np.asarray(t, dtype=np.float64)
        keep = np.ones(len(tt), dtype=bool)
        if self.t_last is not None:
            keep &= tt > self.t_last
        if len(tt) > 1:  # in time order: a sample not after the one before it is a resend
            keep[1:] &= tt[1:] > np.maximum.accumulate(tt)[:-1]
        if not keep.any():
            return
        at = np.flatnonzero(keep).tolist()
        tt = tt[at]
        self.t_last = float(tt[-1])

        def col(k: str) -> np.ndarray | None:
            c = cols.get(k)
            if c is None:
                return None
            a = np.array([np.nan if v is None else v for v in (c[i] for i in at)], dtype=np.float64)
            return None if np.isnan(a).all() else a

        blocks = cols.get("ecc_blocks")
        if blocks is not None:
            said = [blocks[i] for i in at if blocks[i]]
            if said:
                self.blocks = str(said[-1])
        ce, ue = col("ecc_correctable"), col("ecc_uncorrectable")
        if ce is not None or ue is not None:
            self._ecc_columns(tt, ce, ue)
        p, th, hbm = col("throttle_power"), col("throttle_thermal"), col("throttle_hbm")
        if p is None and th is None and hbm is None:
            return
        zero = np.zeros(len(tt))
        p, th, hbm = (zero if a is None else a for a in (p, th, hbm))
        has = ~(np.isnan(p) & np.isnan(th) & np.isnan(hbm))
        clock = col("clock_mhz")
        clock = np.full(len(tt), np.nan) if clock is None else clock
        self.t.extend(tt[has].tolist())
        self.power.extend(np.nan_to_num(p[has]).tolist())
        self.thermal.extend(np.maximum(np.nan_to_num(th[has]), np.nan_to_num(hbm[has])).tolist())
        self.clock.extend(clock[has].tolist())
        if not np.isnan(clock[has]).all():
            top = float(np.nanmax(clock[has]))
            self.clock_top = max(top, self.clock_top or top)

    def _feed_few(self, t: Sequence[float], cols: Mapping[str, Sequence[Any] | None]) -> None:
        ce_c, ue_c, b_c, p_c, th_c, h_c, k_c = (cols.get(k) for k in COLUMNS)
        for i, ti in enumerate(t):
            ti = float(ti)
            if self.t_last is not None and ti <= self.t_last:
                continue
            self.t_last = ti
            if b_c is not None and b_c[i]:
                self.blocks = str(b_c[i])
            ce = _value(ce_c, i)
            ue = _value(ue_c, i)
            if (ce is not None and ce != self.ce) or (ue is not None and ue != self.ue):
                self._ecc(ti, ce, ue)
            p, th, hbm = _value(p_c, i), _value(th_c, i), _value(h_c, i)
            if p is None and th is None and hbm is None:
                continue
            clock = _value(k_c, i)
            self.t.append(ti)
            self.power.append(p or 0.0)
            self.thermal.append(max(th or 0.0, hbm or 0.0))
            self.clock.append(np.nan if clock is None else clock)
            if clock is not None:
                self.clock_top = max(clock, self.clock_top or clock)

    def _ecc_columns(self, t: np.ndarray, ce: np.ndarray | None, ue: np.ndarray | None) -> None:
        """The samples where a count is the first one or differs from the one before it, one by one."""
        moved = np.zeros(len(t), dtype=bool)
        for a, last in ((ce, self.ce), (ue, self.ue)):
            if a is None:
                continue
            prev = np.concatenate([[np.nan if last is None else last], a[:-1]])
            moved |= ~np.isnan(a) & ((a != prev) | np.isnan(prev))
        for i in np.flatnonzero(moved).tolist():
            self._ecc(
                float(t[i]),
                None if ce is None or np.isnan(ce[i]) else float(ce[i]),
                None if ue is None or np.isnan(ue[i]) else float(ue[i]),
            )

    def _ecc(self, t: float, ce: float | None, ue: float | None) -> None:
        if ue is not None:
            if self.ue_first is None:
                self.ue_first = int(ue)
            elif self.ue is not None and ue > self.ue:
                self.ue_rises.add(t)
            self.ue = int(ue)
        if ce is None:
            return
        if self.ce_first is None:
            self.ce_first = self.ce_before = int(ce)
        elif self.ce is not None and ce > self.ce:
            self.ce_changes.append((t, int(ce)))
        self.ce = int(ce)
        while self.ce_changes and self.ce_changes[0][0] < t - CE_WINDOW_S:
            self.ce_before = self.ce_changes.popleft()[1]
        n = self.ce - self.ce_before
        if n >= CE_FAST and self.ce_changes and self.ce_changes[-1][0] == t:
            self.ce_fast.add(t)
            self.ce_fast_n = n

    def findings(self, j: Judging, rate: tuple[np.ndarray, np.ndarray]) -> list[Finding]:
        out = []
        who = where(self.gpu, self.node)
        if self.ue_rises.n and self.ue is not None and self.ue_first is not None:
            blocks = blocks_with(self.blocks, 1)
            inside = f" in {', '.join(f'{b} ({n})' for b, n in blocks)}" if blocks else ""
            out.append(
                Finding(
                    "gpu_ecc_uncorrectable",
                    "critical",
                    self.gpu,
                    self.ue_rises.times(),
                    j.steps.step_at(self.ue_rises.times()[0]),
                    f"{who}: {self.ue - self.ue_first} uncorrectable ECC error(s) during the job "
                    f"({self.ue_first} → {self.ue}){inside}",
                    "Uncorrectable memory errors change what the GPU computes: what this run trained after "
                    "the first one is suspect. Stop the job, take the GPU out of service for a reset and "
                    "your vendor's page-retirement check, and resume from the last checkpoint before the "
                    "first error on another GPU; left running, it keeps training on that memory.",
                    j.running,
                    count=len(self.ue_rises),
                    first=self.ue_rises.first,
                )
            )
        if self.ce_fast.n:
            blocks = blocks_with(self.blocks, 0)
            inside = f" (most in {blocks[0][0]})" if blocks else ""
            out.append(
                Finding(
                    "gpu_ecc_correctable",
                    "warning",
                    self.gpu,
                    self.ce_fast.times(),
                    j.steps.step_at(self.ce_fast.times()[-1]),
                    f"{who}: {self.ce_fast_n} correctable ECC errors within {CE_WINDOW_S / 60:.0f} min"
                    f"{inside}; {self.ce} since the driver loaded",
                    "The errors were corrected, so the run's numbers are sound, but a rising rate often comes "
                    "before uncorrectable ones: plan to move the job off this GPU at its next checkpoint and "
                    "have the GPU checked; if the rate keeps rising, each further error costs a retry, not data.",
                    j.running and self.ce_fast.recent[-1] >= (self.t_last or 0) - CE_WINDOW_S,
                    count=len(self.ce_fast),
                    first=self.ce_fast.first,
                )
            )
        if (f := self._throttle(j, rate)) is not None:
            out.append(f)
        return out

    def _throttle(self, j: Judging, rate: tuple[np.ndarray, np.ndarray]) -> Finding | None:
        rt, ry = rate
        if len(self.t) < 3 or len(rt) < 2 * RATE_MEDIAN:
            return None
        if max(max(self.power), max(self.thermal)) < THROTTLE_SHARE:  # no window can reach the share
            return None
        st = np.fromiter(self.t, np.float64, len(self.t))
        share = np.maximum(
            np.fromiter(self.power, np.float64, len(st)), np.fromiter(self.thermal, np.float64, len(st))
        )
        csum = np.concatenate([[0.0], np.cumsum(share)])
        t_med, med, prior = medians(rt, ry)
        with np.errstate(invalid="ignore", divide="ignore"):
            drop = 1.0 - med / prior
        hi = np.searchsorted(st, t_med, side="right")
        lo = np.searchsorted(st, t_med - THROTTLE_WINDOW_S, side="right")
        n = hi - lo
        with np.errstate(invalid="ignore", divide="ignore"):
            held = (csum[hi] - csum[lo]) / n
        hit = (n >= 3) & (drop >= THROTTLE_DROP) & (held >= THROTTLE_SHARE)
        if not hit.any():
            return None
        at = np.flatnonzero(hit)
        k = int(at[-1])
        s, e = int(lo[k]), int(hi[k])
        power = float(np.mean(np.fromiter(self.power, np.float64, len(st))[s:e]))
        thermal = float(np.mean(np.fromiter(self.thermal, np.float64, len(st))[s:e]))
        clocks = np.fromiter(self.clock, np.float64, len(st))[s:e]
        clock = (
            f"; clock {np.nanmean(clocks):.0f} MHz against {self.clock_top:.0f} MHz at best"
            if self.clock_top is not None and not np.isnan(clocks).all()
            else ""
        )
        times = t_med[at].tolist()
        why = " and ".join(
            f"{name} {v:.0%}" for name, v in (("power", power), ("thermal", thermal)) if v >= 0.005
        )
        return Finding(
            "gpu_throttle",
            "warning",
            self.gpu,
            times[-512:],
            j.steps.step_at(times[-1]),
            f"{where(self.gpu, self.node)}: throttled {held[k]:.0%} of the last {THROTTLE_WINDOW_S:.0f} s "
            f"({why}) while tokens/s fell {drop[k]:.0%} below the run's best ({prior[k]:.0f} → {med[k]:.0f})"
            f"{clock}",
            "The GPU's own limits hold its clocks down, not the job's settings: check the node's cooling "
            "and the GPU's power cap (amd-smi metric, nvidia-smi -q -d PERFORMANCE). While it lasts the run "
            f"takes about {1 / (1 - drop[k]):.2f}× as long per step; moving it to an unthrottled GPU at its "
            "next checkpoint restores the earlier tokens/s, and a smaller batch would not (it only does less a step).",
            j.running and k == len(t_med) - 1,
            count=len(times),
            first=times[0],
        )


class Hardware:
    """The hardware detectors of a job: a Device per (node, GPU), and the job's tokens/s."""

    def __init__(self) -> None:
        self.devices: dict[tuple[str, int], Device] = {}
        self.rate_t = deque[float](maxlen=KEPT)
        self.rate = deque[float](maxlen=KEPT)

    def feed(self, node: str, gpu: int, t: Sequence[float], cols: Mapping[str, Sequence[Any] | None]) -> None:
        """One device's samples, in time order (any of COLUMNS)."""
        if gpu < 0 or not any(cols.get(k) is not None for k in COLUMNS):
            return
        dev = self.devices.get((node, gpu))
        if dev is None:
            dev = self.devices[(node, gpu)] = Device(gpu, node)
        dev.feed(t, cols)

    def feed_columns(self, node: str, cols: dict[str, Any]) -> None:
        """A batch's samples as columns (every device mixed, each in time order)."""
        if not any(cols.get(k) is not None for k in COLUMNS):
            return
        gpu = np.asarray(cols["gpu"])
        for g in dict.fromkeys(gpu.tolist()):
            at = np.flatnonzero(gpu == g)
            part = {k: [cols[k][i] for i in at] for k in COLUMNS if cols.get(k) is not None}
            self.feed(node, int(g), [cols["t"][i] for i in at], part)

    def feed_points(self, points: Iterable[Point]) -> None:
        for p in points:
            tps = getattr(p, "throughput", None)
            if tps is not None and tps == tps and (not self.rate_t or p.t > self.rate_t[-1]):
                self.rate_t.append(p.t)
                self.rate.append(float(tps))

    def findings(self, j: Judging, on_gpus: bool = False) -> list[Finding]:
        rate = (
            np.fromiter(self.rate_t, np.float64, len(self.rate_t)),
            np.fromiter(self.rate, np.float64, len(self.rate)),
        )
        out = []
        for key in sorted(self.devices):
            for f in self.devices[key].findings(j, rate):
                f.node = key[0]
                out.append(f)
        if (on_gpus or self.devices) and not any(f.kind == "gpu_throttle" for f in out):
            out += self._drop(j, rate)
        return out

    def _drop(self, j: Judging, rate: tuple[np.ndarray, np.ndarray]) -> list[Finding]:
        rt, ry = rate
        if len(rt) < RATE_MEDIAN + DROP_POINTS:
            return []
        t_med, med, prior = medians(rt, ry)
        with np.errstate(invalid="ignore", divide="ignore"):
            low = (1.0 - med / prior) >= DROP
        # The runs of low points, and the last one that lasted DROP_POINTS.
        edges = np.flatnonzero(np.diff(np.concatenate([[0], low.astype(np.int8), [0]])))
        runs = [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2]) if b - a >= DROP_POINTS]
        if not runs:
            return []
        a, b = runs[-1]
        best, now = float(prior[a]), median(med[a:b])
        began = float(t_med[a])
        step = j.steps.step_at(began)
        times = t_med[a:b].tolist()
        return [
            Finding(
                "throughput_drop",
                "warning",
                None,
                times[-512:],
                step,
                f"tokens/s fell {1 - now / best:.0%} below the run's best ({best:.0f} → {now:.0f}) from "
                f"{'step ' + str(step) if step is not None else 'here'} on, for {b - a} logged points, "
                "with no throttling on the job's GPUs to explain it",
                "Something else now takes the job's time: another process on its GPUs or its node's CPUs "
                "(the node's page lists the GPUs' processes), a slower data path (a dataset on a network "
                "filesystem, too few preprocessing_num_workers / dataloader_num_workers), or longer "
                "sequences later in the data (shuffle it, or set cutoff_len). While it lasts each step "
                f"takes about {best / max(now, 1e-9):.2f}× as long.",
                j.running and b == len(t_med),
                count=len(times),
                first=times[0],
            )
        ]
