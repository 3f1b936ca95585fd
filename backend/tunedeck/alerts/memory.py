"""Detectors over one device's memory series: spikes, periodic spikes, near-OOM, plateau.

A `Gpu` consumes its device's samples in time order, in chunks of any size, and keeps bounded state:
the last samples of the level and noise windows, the excursions still up, running counts, and a
fixed number of blocks that summarise the whole run for the plateau. What it reports does not depend
on how the samples were chunked: a run fed whole (an import) and fed batch by batch (live) agree.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from collections.abc import Sequence
from operator import add

import numpy as np
from numpy.lib.stride_tricks import as_strided

from tunedeck.alerts import advice
from tunedeck.alerts.phases import in_phase
from tunedeck.alerts.series import (
    KEEP,
    Finding,
    Judging,
    Limits,
    Occurrences,
    Series,
    device,
    gib,
    median,
)

LEVEL = 10  # samples in the baseline level
HISTORY = 5  # samples before the first that is judged against the ones before it
WINDOW = 30  # samples in the noise estimate (even: _mads takes the mean of the two middle values)
MAX_SPIKE = 3  # the widest excursion the first samples' rule accepts
AFTER = 5  # samples after an early excursion that show the level it fell back to
EARLY = HISTORY - 1 + MAX_SPIKE + AFTER  # samples that settle the first samples' rule
EXCURSION_S = 60.0  # a rise that has not come back down within this is a level change, not a spike
DEPTH = 8  # excursions up on top of one another at once
SMOOTH = 9  # the plateau's median: it ignores spikes up to 4 samples wide
# The floor a device stands on between spikes: the FLOOR_RANK-th lowest (from 0) of the same SMOOTH
# samples. Spikes that recur every few samples, up half the time or more, move the median (it sits on
# their top for stretches), not this one: it reads the level under spikes up to SMOOTH - 1 - FLOOR_RANK
# samples of the SMOOTH, and a single sample down (a release) does not pull it.
FLOOR_RANK = 1
BLOCKS = 512  # the plateau's summary of a run of any length
PERIOD_SPREAD = 1.4  # a regular gap lies within this factor of the period (20 % jitter either way fits)
LOADING_S = 60.0  # the first seconds of a job: weights arrive in shards (their transients recur at no period)
AT_SAVE_S = 60.0  # a spike within this after a checkpoint save's line is that save's
SAVE_SLACK_S = 5.0  # ... or this little before it (the line and the samples are read on their own)
# A leak: after warm-up the smoothed level climbs up to its highest by at least LEAK_RISE of the card
# (LEAK_MIN_S or longer, and over half the run after warm-up at least), steadily: of the lower quartiles of TREND_PARTS equal stretches (what eval
# bumps stand on), LEAK_STEADY of the pairs stand in time order (noise: half; one level change: at
# most 0.77).
LEAK_RISE = 0.10
LEAK_MIN_S = 300.0
TREND_PARTS = 16
LEAK_STEADY = 0.85
PAIRS = np.triu_indices(TREND_PARTS, 1)  # (i, k) of each pair of parts, i < k
MIB64 = 64 * 1024**2
STRETCH = 64  # samples whose levels are computed together when one of them is judged one by one
# A settled window, for the healthy-plateau finding, holds at least this many samples (the noise
# estimate's own window: fewer cannot tell a flat line from noise) and this many seconds (several
# optimizer steps of any real run, whose step takes 2-20 s on a 7B LoRA).
SETTLED_N = WINDOW
SETTLED_S = 60.0
NOISE = 1.4826 / math.sqrt(2)  # a MAD of step-to-step differences as the sample noise
# The share of the card a spike must at least add (a floor of the threshold). A step-to-step difference
# that large is an edge of an excursion, not noise: the noise estimate counts it as no change. Spikes
# that recur every 4 samples or oftener (a 4 s optimizer step sampled at 1 Hz) put an edge in half the
# differences or more: counted as they were, they raised the MAD to half the spikes' height and the
# threshold over the spikes (the pattern went unfound, or a few of its spikes were told one-off).
CARD_SHARE = 0.02


Evals = tuple[tuple[np.ndarray, np.ndarray], float]


class OutOfOrder(ValueError):
    """A sample older than one already consumed: the state has to be rebuilt from the stored series."""


def threshold(level: float, noise: float, total: float | None) -> float:
    """The detector's floor: how far above its level a sample must stand to start an excursion."""
    return max(6 * noise, 0.05 * level, CARD_SHARE * total if total else 0.0, MIB64)


def _mad(w: np.ndarray) -> float:
    return median(np.abs(w - median(w))) * NOISE if len(w) else 0.0


def _windows(a: np.ndarray, w: int) -> np.ndarray:
    """The windows of w samples of a, as rows (a read-only view; sliding_window_view's checks cost more
    than the rest on a batch of a few samples)."""
    return as_strided(a, (len(a) - w + 1, w), (a.strides[0], a.strides[0]), writeable=False)


def levels(full: np.ndarray, h: int) -> tuple[np.ndarray, np.ndarray]:
    """For each sample of full[h:], from the samples before it: the level (median of the last LEVEL)
    and their spread (max - min).
    full[:h] holds the WINDOW + 1 samples before, or every one when the run is shorter."""
    m = len(full) - h
    base, spread = np.empty(m), np.empty(m)
    for p in range(h, min(h + m, LEVEL)):  # windows cut short by the start of the run
        base[p - h] = median(full[:p]) if p else math.nan
        spread[p - h] = float(np.ptp(full[:p])) if p else math.inf
    lo = max(h, LEVEL)
    if lo < h + m:
        w = _windows(full[:-1], LEVEL)[lo - LEVEL :]
        base[lo - h :], spread[lo - h :] = np.median(w, axis=1), np.ptp(w, axis=1)
    return base, spread


def _mads(w: np.ndarray) -> np.ndarray:
    """The MAD of each row of w (rows of an even length), as np.median would give it, for a fraction of
    its cost: one sort; the deviations from the median then lie in two sorted runs (below and above
    it), whose two middle order statistics are found without sorting again."""
    h = w.shape[1] // 2
    s = np.sort(w, axis=1).T  # a column a window: the steps below run along the rows, over all windows
    med = (s[h - 1] + s[h]) / 2
    a, b = np.abs(s[h - 1 :: -1] - med), np.abs(s[h:] - med)  # below and above the median, smallest first
    # The k-th smallest of two sorted runs: the least, over the ways to take k + 1 from them, of the
    # largest taken.
    lower = np.minimum(np.minimum(a[h - 1], b[h - 1]), np.maximum(a[: h - 1], b[h - 2 :: -1]).min(axis=0))
    upper = np.maximum(a, b[::-1]).min(axis=0)
    return (lower + upper) / 2


def edges(total: np.ndarray) -> np.ndarray:
    """For samples with these capacities (0: unknown), the size from which a step into each is an
    excursion's edge (see CARD_SHARE; none where the card is unknown)."""
    return np.where(total > 0, np.maximum(CARD_SHARE * total, MIB64), np.inf)


def noise_smooth(full: np.ndarray, h: int, edge: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """For each sample of full[h:]: the noise (MAD of the last WINDOW step-to-step differences before
    it, which a warm-up ramp or a level change does not inflate; a difference into sample r of
    edge[r] or more counts as 0) and the plateau's smoothed value (median of the last SMOOTH, itself
    included). full[:h] as for `levels`; when the run is shorter, full[0] is its first sample, which
    pads the smoothing window as if it had been there before."""
    m = len(full) - h
    noise, smooth = np.empty(m), np.empty(m)
    d = np.diff(full)  # d[r] = full[r + 1] - full[r]
    if edge is not None:
        d = np.where(np.abs(d) < edge[1:], d, 0.0)
    for p in range(h, min(h + m, WINDOW + 1)):  # windows cut short by the start of the run
        noise[p - h] = _mad(d[: max(0, p - 1)])  # p <= WINDOW: the window starts at the run's start
        if p < SMOOTH - 1:  # the padding (SMOOTH - 1 itself: no padding, the window whole, as below)
            smooth[p - h] = float(
                np.median(np.concatenate([np.repeat(full[0], SMOOTH - 1 - p), full[: p + 1]]))
            )
    lo = max(h, WINDOW + 1)
    if lo < h + m:
        noise[lo - h :] = _mads(_windows(d[:-1], WINDOW)[lo - 1 - WINDOW :]) * NOISE
    lo = max(h, SMOOTH - 1)
    if lo < h + m:  # an odd window: its median is its middle value
        w = _windows(full, SMOOTH)[lo - SMOOTH + 1 :]
        smooth[lo - h :] = np.partition(w, SMOOTH // 2, axis=1)[:, SMOOTH // 2]
    return noise, smooth


def floors(full: np.ndarray, h: int) -> np.ndarray:
    """For each sample of full[h:]: the FLOOR_RANK-th lowest of the last SMOOTH, itself included
    (before the run's SMOOTH-th sample its first pads the window, as for the smoothed value)."""
    m = len(full) - h
    pad = max(0, SMOOTH - 1 - h)
    x = np.concatenate([np.repeat(full[:1], pad), full]) if pad else full
    w = _windows(x, SMOOTH)[len(x) - SMOOTH + 1 - m :]
    return np.partition(w, FLOOR_RANK, axis=1)[:, FLOOR_RANK]


def early_spikes(y: np.ndarray, total: float | None) -> tuple[list[tuple[int, int, float]], int]:
    """Spikes among the first samples, which have too little history for a baseline before them:
    an excursion of at most MAX_SPIKE samples that rose from the sample before it and fell back to
    the level the run then held (the median of the AFTER samples that follow it) is judged against
    that level. A loading peak above the working level is such a spike; a warm-up climb is not (it
    never stands above what follows), nor is a high first sample (nothing shows it rose). Judged
    once AFTER samples follow the excursion. Returns (start, peak, level) of each spike and the index
    judging goes on from."""
    out, resume, n = [], 0, len(y)
    i = 1
    while i < min(n, HISTORY):
        hit = None
        for j in range(i + 1, i + MAX_SPIKE + 1):
            if j + AFTER > n:
                break
            ref = median(y[j : j + AFTER])
            thr = threshold(ref, 0.0, total)
            if (
                y[i - 1] <= ref + thr / 2
                and y[i:j].min() > ref + thr / 2
                and y[i:j].max() > ref + thr
                and y[j] <= ref + thr / 2
            ):
                hit = j, ref
                break
        if hit is None:
            i += 1
            continue
        j, ref = hit
        out.append((i, i + int(np.argmax(y[i:j])), ref))
        i = resume = j
    return out, resume


def periodic(times: list[float]) -> float | None:
    """The period when at least 4 spikes recur at a regular interval: 3 in 4 gaps within
    PERIOD_SPREAD of the mean gap (the mean of those near the median gap, so that one missed or extra
    spike does not move it)."""
    if len(times) < 4:
        return None
    d = np.diff(times)
    mid = median(d)
    if not mid:  # the times are sorted: a median gap is never negative
        return None
    p = float(np.mean(d[(d >= mid / 1.6) & (d <= mid * 1.6)]))
    regular = (d >= p / PERIOD_SPREAD) & (d <= p * PERIOD_SPREAD)
    return p if np.mean(regular) >= 0.75 else None


def _halved(blocks: list[list]) -> list[list]:
    """Consecutive plateau blocks merged two by two (column by column: one call per field, not per pair)."""
    a, c = list(zip(*blocks[::2])), list(zip(*blocks[1::2]))
    return list(
        map(
            list,
            zip(
                a[0],
                a[1],
                c[2],
                map(add, a[3], c[3]),
                map(min, a[4], c[4]),
                map(max, a[5], c[5]),
                map(add, a[6], c[6]),
                map(add, a[7], c[7]),
                map(add, a[8], c[8]),
            ),
        )
    )


class _Up:
    """An excursion still above the level it rose from."""

    __slots__ = ("base", "n", "peak", "recent", "settled", "t0", "thr")

    def __init__(self, t: float, y: float, base: float, thr: float, settled: bool):
        self.t0, self.base, self.thr, self.peak, self.n, self.settled = t, base, thr, y, 1, settled
        self.recent: deque[float] = deque([y], maxlen=LEVEL)  # the samples while it was the top one

    def level(self) -> tuple[float, float, int]:
        """The median of the recent samples, their spread and how many there are."""
        s = sorted(self.recent)
        k = len(s) // 2
        return (s[k] if len(s) % 2 else (s[k - 1] + s[k]) / 2), s[-1] - s[0], len(s)


class Gpu:
    """One device's detector state. `bulk=False` judges every sample one by one (the reference the
    bulk path is held to)."""

    def __init__(self, gpu: int, lim: Limits, bulk: bool = True):
        self.gpu, self.share = gpu, lim.near_oom_share
        self.mem = "memory" if gpu == -1 else "VRAM"  # a CPU job's series is the host's memory
        self.n = 0
        self.t_first = self.t_last = 0.0
        self.total = 0.0  # the largest capacity reported; 0: unknown
        self._hist = self._edge = np.empty(0)  # the last samples, and their edges (see `edges`)
        self._early: list[tuple[float, ...]] | None = []  # the first samples, until EARLY of them came
        self._up: list[_Up] = []
        self.spikes = Occurrences()
        # t0, peak, base, early, lasted of the most recent spikes
        self.records: deque[tuple[float, float, float, bool, float]] = deque(maxlen=KEEP)
        self.largest: tuple[float, float, bool] = (0.0, 0.0, False)  # peak, level, while starting
        self.widest = 0.0  # seconds, of the excursions wider than MAX_SPIKE samples
        self.run = self.longest = 0  # samples in a row over the near-OOM share
        self.near = Occurrences()
        self.near_peak = 0.0
        self.calm_from = -math.inf  # the end of the last spike or near-OOM sample: no plateau before it
        # The plateau's blocks: [first index, t0, t1, samples, min, max, sum of smoothed, sum of noise,
        # sum of floors].
        self.blocks: list[list] = []
        self.block = 1
        self._cur: list | None = None
        # The closed blocks as an array, made again only when they change (see _block_rows).
        self._rows: tuple[tuple[int, int], np.ndarray] = ((0, 1), np.empty((0, 9)))
        self.bulk = bulk
        self.skipped = 0  # samples passed over in bulk, nothing up and none rising (benchmarks, tests)

    def feed(self, t: np.ndarray, y: np.ndarray, total: np.ndarray) -> None:
        """Consume samples in time order (total 0 where unknown)."""
        if not len(t):
            return
        if (self.n and t[0] < self.t_last) or (len(t) > 1 and np.any(np.diff(t) < 0)):
            raise OutOfOrder(f"GPU {self.gpu}: a sample at {float(np.min(t))} after one at {self.t_last}")
        full, h = np.concatenate([self._hist, y]), len(self._hist)
        tot = np.maximum.accumulate(np.concatenate([[self.total], total]))[1:]
        edge = np.concatenate([self._edge, edges(tot)])
        noise, smooth = noise_smooth(full, h, edge)
        if not self.n:
            self.t_first = float(t[0])
        n0, m = self.n, len(t)
        # The three detectors share no state but calm_from, which each only raises: each takes the
        # whole batch in turn.
        self._near(t, y, tot)
        self._plateau(n0, t, smooth, noise, floors(full, h))
        k = 0
        if self._early is not None:
            k = min(m, EARLY - n0)
            base, spread = levels(full[: h + k], h)
            self._early += zip(*(a[:k].tolist() for a in (t, y, base, spread, noise, tot)))
            if n0 + k == EARLY:
                self._settle()
        if k < m:
            rises = self._rises(full, h, k, y, noise, tot) if self.bulk else np.arange(k, m)
            lo = hi = 0  # the levels, for samples lo to hi: computed a stretch at a time, only where needed
            while k < m:
                if not self._up:  # nothing up: every sample up to the next rise changes nothing
                    nxt = int(rises[np.searchsorted(rises, k)]) if len(rises) and rises[-1] >= k else m
                    self.skipped += nxt - k
                    if (k := nxt) == m:
                        break
                if k >= hi:  # past the first samples: whole windows of the LEVEL before each
                    lo, hi = k, min(m, k + STRETCH)
                    w = _windows(full, LEVEL)[h + lo - LEVEL : h + hi - LEVEL]
                    base, spread = np.median(w, axis=1), np.ptp(w, axis=1)
                b, sp = float(base[k - lo]), float(spread[k - lo])
                self._step(float(t[k]), float(y[k]), b, sp, float(noise[k]), float(tot[k]))
                k += 1
        self.n = n0 + m
        self.t_last, self.total = float(t[-1]), float(tot[-1])
        self._hist, self._edge = full[-(WINDOW + 1) :], edge[-(WINDOW + 1) :]

    def _rises(self, full: np.ndarray, h: int, k: int, y: np.ndarray, noise: np.ndarray, tot: np.ndarray):
        """The indices from k on of the samples that would start an excursion with nothing up (the
        rest change nothing then). A cheap bound first: the lowest of the LEVEL samples before (never
        above their median) plus the threshold without its noise term (never above the threshold);
        the few samples over it are judged exactly, as `_step` judges them."""
        n, at = len(y) - k, h + k - LEVEL  # full[at + i : at + i + LEVEL] are the samples before y[k + i]
        low = _windows(full, LEVEL)[at : at + n].min(axis=1)
        yk, tk = y[k:], tot[k:]
        share = np.where(tk != 0, CARD_SHARE * tk, 0.0)
        maybe = np.flatnonzero(yk > low + np.maximum(np.maximum(0.05 * low, share), MIB64))
        if not len(maybe):
            return maybe
        w = _windows(full, LEVEL)[at + maybe]
        base = np.median(w, axis=1)
        thr = np.maximum(np.maximum(6 * noise[k:][maybe], 0.05 * base), np.maximum(share[maybe], MIB64))
        return k + maybe[yk[maybe] > base + thr]

    def _settle(self) -> None:
        """Judge the first samples (the early rule), then go on judging each against the level before it."""
        early, self._early = self._early or [], None
        y = np.array([e[1] for e in early])
        found, resume = early_spikes(y, early[-1][-1] or None)
        for start, peak, ref in found:
            self._spike(early[start][0], float(y[peak]), ref, early=True)
        if found:  # the excursions ended before the sample judging resumes at
            self.calm_from = max(self.calm_from, early[min(resume, len(early) - 1)][0])
        for sample in early[max(HISTORY, resume) :]:
            self._step(*sample)

    def _step(self, t: float, y: float, base: float, spread: float, noise: float, total: float) -> None:
        up = self._up
        for i, e in enumerate(up):
            if y <= e.base + e.thr / 2:  # back down from e: e ends, and so does what rose on top of it
                # A wide one must have risen from a settled level and come back to it: falling far below
                # (memory freed at the end of a run) is another change, and a climb has no level to leave.
                if e.n <= MAX_SPIKE or (e.settled and y >= e.base - e.thr / 2):
                    self._spike(
                        e.t0, max(x.peak for x in up[i:]), e.base, lasted=t - e.t0 if e.n > MAX_SPIKE else 0.0
                    )
                    self.calm_from = max(self.calm_from, t)
                del up[i:]
                break
        while up and t - up[0].t0 >= EXCURSION_S:  # still up after that long: the level changed
            up.pop(0)
        for e in up:
            e.peak, e.n = max(e.peak, y), e.n + 1
        # Judged against the level it stands on: the top excursion's own, or the run's.
        level, spread, behind = up[-1].level() if up else (base, spread, LEVEL)
        thr = threshold(level, noise, total or None)
        if y > level + thr:
            up.append(_Up(t, y, level, thr, behind >= LEVEL // 2 and spread <= thr))
            if len(up) > DEPTH:
                up.pop(0)
        elif up:
            up[-1].recent.append(y)

    def _spike(
        self, t0: float, peak: float, base: float, *, early: bool = False, lasted: float = 0.0
    ) -> None:
        self.spikes.add(t0)
        self.records.append((t0, peak, base, early, lasted))
        if peak - base > self.largest[0] - self.largest[1]:
            self.largest = (peak, base, early)
        self.widest = max(self.widest, lasted)

    def _near(self, t: np.ndarray, y: np.ndarray, tot: np.ndarray) -> None:
        above = (tot > 0) & (y >= self.share * tot)
        if not above.any():
            self.run = 0
            return
        k = np.arange(len(y))
        last_below = np.maximum.accumulate(np.where(above, -1, k))
        run = np.where(last_below >= 0, k - last_below, self.run + k + 1)  # samples in a row over, to each
        self.run, self.longest = int(run[-1]), max(self.longest, int(run.max()))
        self.near_peak = max(self.near_peak, float(y[above].max()))
        self.calm_from = max(self.calm_from, float(t[above][-1]))
        self.near.extend(t[run >= 3].tolist())  # sustained: three samples in a row

    def _plateau(self, g: int, t: np.ndarray, s: np.ndarray, noise: np.ndarray, fl: np.ndarray) -> None:
        """Samples g, g + 1, ... into the blocks. The sums add sample by sample, in order (cumulative
        sums): summed otherwise they could differ in the last bit with how the samples came in."""
        k, m = 0, len(t)
        while k < m:
            b = self._cur
            if b is None and m - k >= self.block:  # whole blocks at once, up to the next coarsening
                n = min((m - k) // self.block, BLOCKS - len(self.blocks))
                j = k + n * self.block
                ts, ss, ns, fs = (v[k:j].reshape(n, self.block) for v in (t, s, noise, fl))
                self.blocks += map(
                    list,
                    zip(
                        range(g + k, g + j, self.block),
                        ts[:, 0].tolist(),
                        ts[:, -1].tolist(),
                        [self.block] * n,
                        ss.min(axis=1).tolist(),
                        ss.max(axis=1).tolist(),
                        np.cumsum(ss, axis=1)[:, -1].tolist(),
                        np.cumsum(ns, axis=1)[:, -1].tolist(),
                        np.cumsum(fs, axis=1)[:, -1].tolist(),
                    ),
                )
                k = j
            else:
                if b is None:
                    b = self._cur = [g + k, float(t[k]), 0.0, 0, float(s[k]), float(s[k]), 0.0, 0.0, 0.0]
                j = min(m, k + self.block - b[3])
                b[2], b[3] = float(t[j - 1]), b[3] + j - k
                b[4], b[5] = min(b[4], float(s[k:j].min())), max(b[5], float(s[k:j].max()))
                b[6] = float(np.cumsum(np.concatenate([[b[6]], s[k:j]]))[-1])
                b[7] = float(np.cumsum(np.concatenate([[b[7]], noise[k:j]]))[-1])
                b[8] = float(np.cumsum(np.concatenate([[b[8]], fl[k:j]]))[-1])
                k = j
                if b[3] < self.block:
                    break
                self.blocks.append(b)
                self._cur = None
            if len(self.blocks) == BLOCKS:  # twice as coarse: the summary stays this size however long
                self.blocks = _halved(self.blocks)
                self.block *= 2

    # ------------------------------------------------------------------ findings

    def findings(
        self, j: Judging, evals: Evals | None = None, saves: Sequence[float] = (), loading: float = -math.inf
    ) -> list[Finding]:
        """`evals`: the eval phases (starts, ends) and a step's duration: their own rises are no spikes.
        `saves`: when checkpoint saves began; `loading`: when training began (spikes before are the
        job loading)."""
        if not self.n:
            return []
        judged = self
        if self._early is not None:  # the first samples, judged on what there is so far
            judged = self._draft()
            judged._settle()
        return [
            *judged._spike_findings(j, evals, saves, loading),
            *self._near_findings(j),
            *self._trend_findings(j, loading),
            *judged._plateau_findings(j),
        ]

    def _draft(self) -> Gpu:
        """This detector as `_settle` may change it without changing this one, for a read in the early
        phase: a shallow copy whose judged state (spikes, their records, the excursions up) is its own.
        Nothing has been judged before the first samples settle (`_step` and `_spike` run only from
        there), so that state starts empty; `_settle` only reassigns the rest (the numbers, `_early`)
        and reads the samples, which stay shared."""
        draft = copy.copy(self)
        draft.spikes, draft.records, draft._up = Occurrences(), deque(maxlen=KEEP), []
        return draft

    def _pending(self) -> list[tuple[float, float, float, bool, float]]:
        """The excursions up for at most MAX_SPIKE samples, as spike records: each is a spike unless the
        samples after it show a wider rise. Live, a spike is alerted on the sample that rose."""
        return [(e.t0, e.peak, e.base, False, 0.0) for e in self._up if e.n <= MAX_SPIKE]

    def _not_eval(self, records: list, count: int, evals: Evals | None) -> tuple | None:
        """Of `records` (of `count` spikes), those that did not begin with or during an eval phase:
        (count, first, times, largest, widest); None when none did. Within a few samples and a couple
        of steps: the start of a phase is placed from the step pace when the step it followed was not
        logged."""
        if evals is None or not len(evals[0][0]) or not records:
            return None
        interval = (self.t_last - self.t_first) / max(1, self.n - 1)
        margin = 3 * interval + 2 * evals[1]
        kept = [r for r in records if not in_phase(evals[0], r[0], margin)]
        if len(kept) == len(records):
            return None
        n = count - (len(records) - len(kept))
        if not kept:
            return 0, None, [], (0.0, 0.0, False), 0.0
        big = max(kept, key=lambda r: r[1] - r[2])
        first = kept[0][0] if n == len(kept) else self.spikes.first
        return n, first, [r[0] for r in kept], big[1:4], max(r[4] for r in kept)

    @staticmethod
    def _at_saves(s: Series, trained: list[float], at: list[float] | None, saves: Sequence[float]) -> bool:
        """Whether 3 in 4 of the spikes began at a checkpoint save: within AT_SAVE_S after the output's
        save line, or (without lines) at a multiple of the save_steps set (to within a step or 2 %)."""
        if not trained:
            return False
        if saves:
            # A save's spike comes once its line is out (the gather and the write follow it), so each
            # spike is matched to the last save line before it (SAVE_SLACK_S for the two clocks): a
            # spike shortly before a save, such as one a cancel's save followed, is not that save's.
            x, t = np.asarray(saves, dtype=np.float64), np.asarray(trained)
            i = np.searchsorted(x, t + SAVE_SLACK_S, side="right") - 1
            after = t - x[np.maximum(i, 0)]
            return float(np.mean((i >= 0) & (after <= AT_SAVE_S))) >= 0.75
        # Only saves the config names: the Trainer's default (every 500 steps) is too weak a match alone.
        every = advice.step_events(s.config)[0] if "save_steps" in s.config else 0
        if at is None or not every:
            return False
        off = np.asarray(at) - every * np.round(np.asarray(at) / every)
        return (
            float(
                np.mean((np.round(np.asarray(at) / every) >= 1) & (off >= -1) & (off <= max(2, 0.02 * every)))
            )
            >= 0.75
        )

    def _spike_findings(
        self, j: Judging, evals: Evals | None = None, saves: Sequence[float] = (), loading: float = -math.inf
    ) -> list[Finding]:
        s, steps, lim, now, running = j
        gpu, total = self.gpu, self.total or None
        pending = self._pending() if running else []
        if not self.spikes.n and not pending:
            return []
        records = sorted([*self.records, *pending])
        count = self.spikes.n + len(pending)
        first = self.spikes.first if self.spikes.n else records[0][0]
        times = [r[0] for r in records]
        peak, base, early = max([self.largest, *(r[1:4] for r in pending)], key=lambda r: r[0] - r[1])
        widest = self.widest
        cut = self._not_eval(records, count, evals)
        if cut is not None:
            count, first, times, (peak, base, early), widest = cut
            if not times:
                return []
        up = " (the newest is still up)" if any(r[0] in times for r in pending) else ""

        def found(
            kind: str, msg: str, sug: str | None, change: dict | None, sev: str = "warning"
        ) -> list[Finding]:
            recent = running and now - times[-1] <= lim.hold_s
            at = steps.step_at(times[-1])
            return [Finding(kind, sev, gpu, times, at, msg + up, sug, recent, count, first, change)]

        # Transients while the job loads (shards arriving, in the first minute or before training began)
        # recur at no period of training's.
        trained = [t for t in times if t >= max(loading, self.t_first + LOADING_S)]
        period = periodic(trained)
        at = steps.at(trained)
        sp = median(np.diff(at)) if at is not None and len(at) > 1 else None
        # Before blaming the batch or accumulation: what else recurs with the spikes (checkpoint saves,
        # evaluations, logging).
        cause = advice.spike_cause(s, sp if period else None, self._at_saves(s, trained, at, saves))
        added, top = f"+{gib(peak - base)}", gib(peak) + (f" of {gib(total)}" if total else "")
        if cause in ("save", "eval") and trained:
            what = "checkpoint save" if cause == "save" else "evaluation"
            steps_at = f" (≈{sp:.0f} optimizer steps)" if sp is not None and period else ""
            tip = advice.save_peak(s, added, top) if cause == "save" else advice.eval_peak(s, added, top)
            when = f", every {period:.1f} s{steps_at}" if period else ""
            msg = f"{device(gpu)}: {self.mem} rises by up to {added} (to {gib(peak)}) at each {what}{when}; {count} time(s)"
            return found(
                "vram_periodic_spikes" if period else "vram_spike", msg, tip.text, tip.change, "info"
            )
        if period is None:
            msg = (
                f"{device(gpu)}: {count} transient {self.mem} spike(s); the largest reached {gib(peak)}, "
                f"+{gib(peak - base)} above the {gib(base)} baseline"
                + (f" ({100 * peak / total:.0f}% of {gib(total)})" if total else "")
                + (f"; the longest lasted {widest:.0f} s" if widest else "")
            )
            relief = advice.memory_relief(s)
            if early:  # no batch to blame yet: the job was starting (loading, first batches)
                sug = "a peak while the job started, above the level it then held; if it nears capacity, "
            else:
                sug = (
                    f"a one-off peak: check the longest batches (cutoff_len {s.config.get('cutoff_len', '?')}); "
                    "if it recurs, "
                )
            return found("vram_spike", msg, sug + relief.text, relief.change)
        g = advice.ga(s)
        every = ""
        tips: list = []
        if sp is not None:
            mb = sp * g
            every = f" (≈{sp:.1f} optimizer steps = {mb:.0f} micro-batches)"
            if cause == "logging":
                tips.append(
                    f"the spikes come with each logged step (logging_steps {s.config.get('logging_steps')}), "
                    "not with optimizer steps: what runs when the Trainer logs (metrics gathered across "
                    "ranks, logging callbacks) allocates them; a higher logging_steps makes them rarer"
                )
            elif cause == "optimizer":
                tips.append(advice.optimizer_peak(s, mb))
        elif g > 1:  # steps unknown: with accumulation, the step is the likeliest allocation to recur
            tips.append(advice.optimizer_peak(s, None))
        tips.append(advice.reduce_bucket(s))
        if not any(tips):
            relief = advice.memory_relief(s)
            lead = "spikes at the optimizer step: " if cause in ("optimizer", "") else "spikes in training: "
            tips.append(advice.Tip(lead + relief.text, relief.change))
        sug, change = advice.combine(tips, ", or ")
        msg = (
            f"{device(gpu)}: {self.mem} spikes by up to +{gib(peak - base)} (to {gib(peak)}) every {period:.1f} s{every}; "
            f"{count} spikes"
        )
        return found("vram_periodic_spikes", msg, sug, change)

    def _trend_findings(self, j: Judging, loading: float = -math.inf) -> list[Finding]:
        """Memory rising steadily after warm-up (a leak), with the time left until it fills the card at
        that rate. Judged on the plateau's blocks (their smoothed means), up to the highest."""
        s, steps, lim, now, running = j
        total = self.total
        if not total or len(self.blocks) < 2 * TREND_PARTS:
            return []
        b = self._block_rows()
        mid, level = (b[:, 1] + b[:, 2]) / 2, b[:, 6] / b[:, 3]
        after = (b[:, 0] >= max(5, self.n // 10)) & (mid >= max(loading, self.t_first + LOADING_S) + 60)
        mid, level = mid[after], level[after]
        if len(mid) < 2 * TREND_PARTS:
            return []
        top = int(np.argmax(level))
        if top + 1 < 2 * TREND_PARTS:
            return []
        span = float(mid[top] - mid[0])
        if span < max(LEAK_MIN_S, 0.5 * float(mid[-1] - mid[0])):
            return []
        # The rise (lower quartile of the last part less that of the first) is at most the last part's
        # highest less the first part's lowest: when that bound is short of LEAK_RISE (by a byte, for
        # the interpolation's rounding) no quartile is needed. Read on every evaluation of every
        # device, the sixteen quartiles were most of the alert engine's CPU on a cluster. (The parts
        # as np.array_split cuts them: the first len % TREND_PARTS one longer than the rest.)
        q, r = divmod(top + 1, TREND_PARTS)
        if float(level[top + 1 - q : top + 1].max() - level[: q + (r > 0)].min()) < LEAK_RISE * total - 1.0:
            return []
        parts = np.array_split(level[: top + 1], TREND_PARTS)
        med = np.array([float(np.percentile(x, 25)) for x in parts])
        rise = float(med[-1] - med[0])
        i, k = PAIRS
        if rise < LEAK_RISE * total or np.mean(med[k] > med[i]) < LEAK_STEADY:
            return []
        rate = float(np.polyfit(mid[: top + 1], level[: top + 1], 1)[0])  # bytes a second
        peak = float(level[top])
        left = (total - peak) / rate if rate > 0 else math.inf
        fell = float(level[-1]) < peak - 0.05 * total  # it fell back since (the process ended, or freed it)
        if fell:
            held = f"; it reached {100 * peak / total:.0f}% of the card"
        else:
            held = f"; at this rate it fills the card in about {max(1.0, left / 60):.0f} min"
        msg = (
            f"{device(self.gpu)}: {self.mem} rose steadily by +{gib(rise)} over {span / 60:.0f} min after warm-up "
            f"({gib(rate * 60)}/min), to {gib(float(med[-1]))} ({100 * med[-1] / total:.0f}% of {gib(total)}){held}"
        )
        sug = (
            "memory that grows step after step is being kept across steps: tensors held from each step (a loss "
            "or outputs kept without .item()/.detach() by a callback or a metric), or a cache that keeps "
            "growing; compare torch.cuda.memory_allocated with memory_reserved over a few steps (allocated "
            "rising: references kept; only reserved rising: fragmentation, which "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True reduces). Until then the run ends out of memory"
        )
        t0 = float(mid[0])
        return [
            Finding(
                "vram_leak",
                "warning",
                self.gpu,
                [t0, float(mid[top])],
                steps.step_at(float(mid[top])),
                msg,
                sug,
                running and not fell,
            )
        ]

    def _near_findings(self, j: Judging) -> list[Finding]:
        s, steps, lim, _, running = j
        total = self.total
        if not total or not self.near.n:
            return []
        times, peak = self.near.times(), self.near_peak
        relief = advice.memory_relief(s)
        msg = (
            f"{device(self.gpu)}: {gib(peak)} of {gib(total)} in use ({100 * peak / total:.1f}%, over "
            f"{100 * lim.near_oom_share:.0f}% for {self.longest} samples)"
        )
        return [
            Finding(
                "vram_near_oom",
                "critical",
                self.gpu,
                times,
                steps.step_at(times[-1]),
                msg,
                "close to out-of-memory: " + relief.text,
                running and self.run >= 3,
                self.near.n,
                self.near.first,
                relief.change,
            )
        ]

    def _block_rows(self) -> np.ndarray:
        """The plateau's blocks as rows, the open one last. The closed ones are converted when they
        change (a block closes every `block` samples), not on every read: that conversion was most of
        a read's cost. Blocks are only appended, or halved into a list of half the length and a
        doubled `block`, so their count and size name their state."""
        key = (len(self.blocks), self.block)
        (n, size), rows = self._rows
        if key != (n, size):
            if size == self.block and n < key[0]:  # blocks appended since: only those are converted
                new = np.array(self.blocks[n:], dtype=np.float64).reshape(-1, 9)
                rows = np.concatenate((rows, new))
            else:
                rows = np.array(self.blocks, dtype=np.float64).reshape(-1, 9)
            self._rows = (key, rows)
        closed = self._rows[1]
        if not self._cur:
            return closed
        return np.vstack((closed, np.array(self._cur, dtype=np.float64)))

    def block_levels(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(middle time, mean smoothed level, lowest smoothed level, first sample's index, mean floor
        under spikes) of each plateau block, the open one last: the whole run's memory at a bounded size."""
        b = self._block_rows()
        return (b[:, 1] + b[:, 2]) / 2, b[:, 6] / b[:, 3], b[:, 4], b[:, 0], b[:, 8] / b[:, 3]

    def _plateau_findings(self, j: Judging) -> list[Finding]:
        """Memory settled after warm-up: the trailing flat stretch of the spike-free baseline covers at
        least half of the run after warm-up (judged on the blocks, so to within 1/BLOCKS of the run).

        "The healthy flat line" must never stand beside a problem on the same device: none while a
        spike or near-OOM finding is open, and the stretch begins after the last spike, near-OOM
        sample and excursion still up. It is a real settled window: at least SETTLED_N samples and
        SETTLED_S seconds, past the first samples (warm-up climb) and past the learning-rate warm-up
        and the first optimizer step (which allocates the optimizer state), where steps are known."""
        s, steps, lim, now, running = j
        n = self.n
        if n < SETTLED_N:
            return []
        if running and ((self.spikes.n and now - self.spikes.recent[-1] <= lim.hold_s) or self.run >= 3):
            return []
        b = self._block_rows()
        i0, size = b[:, 0], b[:, 3]
        warm = max(5, n // 10)
        after = b[i0 >= warm] if np.any(i0 >= warm) else b[-1:]
        level = median(after[:, 6] / after[:, 3])
        sigma = median(after[:, 7] / after[:, 3])  # sample noise, robust
        total = self.total or None
        band = max(0.03 * level, 0.005 * total if total else 0.0, 32 * 1024**2, 4 * sigma)
        w = b[int(np.argmax(i0 + size > warm))]
        t_warm = w[1] + (warm - w[0]) * (w[2] - w[1]) / max(1.0, w[3] - 1)
        t_steps = -math.inf
        if steps.t:
            reached = steps.reached(max(1, advice.warmup_steps(s)))
            if reached is None:  # still warming up
                return []
            t_steps = reached
            t_warm = max(t_warm, t_steps)
        calm = max([self.calm_from, *(e.t0 for e in self._up)])
        # The trailing stretch: blocks from the newest back while their range stays within the band.
        lows, highs = np.minimum.accumulate(b[::-1, 4]), np.maximum.accumulate(b[::-1, 5])
        t0 = b[::-1, 1]
        fits = (
            (highs - lows <= band)
            & ((i0[::-1] >= warm) | (np.arange(len(b)) == 0))
            & (t0 > calm)
            & (t0 >= t_steps)
        )
        k = int(np.argmin(fits)) if not fits.all() else len(b)  # blocks in the stretch
        if k == 0:
            return []
        first, lo, hi = b[len(b) - k], float(lows[k - 1]), float(highs[k - 1])
        start, end = float(first[1]), self.t_last
        if n - first[0] < SETTLED_N or end - start < max(SETTLED_S, 0.5 * (end - t_warm)):
            return []
        share = f" ({100 * level / total:.0f}% of {gib(total)})" if total else ""
        msg = (
            f"{device(self.gpu)}: memory settled at {gib(level)}{share} after {start - self.t_first:.0f} s and stayed "
            f"within {gib(hi - lo)} for {end - start:.0f} s: the healthy flat line"
        )
        tip = advice.plateau_headroom(s, gib(total - level)) if total and level < 0.5 * total else None
        return [
            Finding(
                "vram_plateau",
                "info",
                self.gpu,
                [start, end],
                steps.step_at(end),
                msg,
                tip.text if tip else None,
                running,
                change=tip.change if tip else None,
            )
        ]
