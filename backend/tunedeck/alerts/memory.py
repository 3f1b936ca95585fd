"""Detectors over one device's memory series: spikes, periodic spikes, near-OOM, plateau."""

from __future__ import annotations

import warnings

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tunedeck.alerts import advice
from tunedeck.alerts.series import Finding, Limits, Series, gib

LEVEL = 10  # samples in the baseline level
HISTORY = 5  # samples before the first that is judged against the ones before it
WINDOW = 30  # samples in the noise estimate
MAX_SPIKE = 3  # an excursion longer than this is a level change, not a spike
AFTER = 5  # samples after an early excursion that show the level it fell back to
MIB64 = 64 * 1024**2


def baseline(y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each sample, from the samples before it only: the level (median of the last LEVEL) and
    the noise (MAD of the step-to-step differences over the last WINDOW, which a warm-up ramp or a
    level change does not inflate)."""
    n = len(y)
    med, noise = np.full(n, np.nan), np.full(n, np.nan)
    if n <= HISTORY:
        return med, noise
    pad = np.concatenate([np.full(LEVEL - 1, np.nan), y])
    med[1:] = np.nanmedian(sliding_window_view(pad, LEVEL)[: n - 1], axis=1)
    d = np.concatenate([np.full(WINDOW, np.nan), np.diff(y)])  # d[WINDOW + k] = y[k+1] - y[k]
    win = sliding_window_view(d, WINDOW)[: n - 1]  # for sample i: the diffs up to y[i-1] - y[i-2]
    with warnings.catch_warnings():  # the first windows hold no difference yet
        warnings.simplefilter("ignore", RuntimeWarning)
        c = np.nanmedian(win, axis=1)
        noise[1:] = np.nanmedian(np.abs(win - c[:, None]), axis=1) * 1.4826 / np.sqrt(2)
    med[:HISTORY] = np.nan  # too little history
    return med, np.nan_to_num(noise)


def _threshold(base: float, noise: float, total: float | None) -> float:
    return max(6 * noise, 0.05 * base, 0.02 * total if total else 0.0, MIB64)


def early_spikes(y: np.ndarray, total: float | None) -> tuple[list[tuple[int, float]], int]:
    """Spikes among the first samples, which have too little history for a baseline before them:
    an excursion of at most MAX_SPIKE samples that rose from the sample before it and fell back to
    the level the run then held (the median of the AFTER samples that follow it) is judged against
    that level. A loading peak above the working level is such a spike; a warm-up climb is not (it
    never stands above what follows), nor is a high first sample (nothing shows it rose). Judged
    once AFTER samples follow the excursion. Returns the spikes and the index judging goes on from."""
    out, resume, n = [], 0, len(y)
    i = 1
    while i < min(n, HISTORY):
        hit = None
        for j in range(i + 1, i + MAX_SPIKE + 1):
            if j + AFTER > n:
                break
            ref = float(np.median(y[j:j + AFTER]))
            thr = _threshold(ref, 0.0, total)
            if (y[i - 1] <= ref + thr / 2 and y[i:j].min() > ref + thr / 2 and y[i:j].max() > ref + thr
                    and y[j] <= ref + thr / 2):
                hit = j, ref
                break
        if hit is None:
            i += 1
            continue
        j, ref = hit
        out.append((i + int(np.argmax(y[i:j])), ref))
        i = resume = j
    return out, resume


def spikes(t: np.ndarray, y: np.ndarray, total: float | None) -> list[tuple[int, float]]:
    """(index of the peak, baseline) of every transient excursion that has returned to baseline: the
    first samples by `early_spikes`, every later one against the level of the samples before it."""
    med, mad = baseline(y)
    out, resume = early_spikes(y, total)
    i, n = max(HISTORY, resume), len(y)
    while i < n:
        base = med[i]
        if np.isnan(base):
            i += 1
            continue
        thr = _threshold(base, mad[i], total)
        if y[i] <= base + thr:
            i += 1
            continue
        j = i
        while j < n and j - i <= MAX_SPIKE and y[j] > base + thr / 2:
            j += 1
        if j < n and j - i <= MAX_SPIKE:  # back near the baseline: a transient spike
            out.append((i + int(np.argmax(y[i:j])), float(base)))
        i = j  # a level change: the baseline catches up within LEVEL samples
    return out


def _steps_at(s: Series, times: list[float]) -> list[float] | None:
    pts = [(p.t, p.step) for p in s.points if p.step is not None]
    if len(pts) < 2:
        return None
    pt, ps = zip(*pts)
    return list(np.interp(times, pt, ps))


def step_at(s: Series, t: float) -> int | None:
    v = _steps_at(s, [t])
    if v is None:
        prior = [p.step for p in s.points if p.step is not None and p.t <= t]
        return prior[-1] if prior else None
    return int(round(v[0]))


def periodic(times: list[float]) -> float | None:
    """The period when at least 4 spikes recur at a regular interval (3 in 4 gaps within 25 %)."""
    if len(times) < 4:
        return None
    d = np.diff(times)
    p = float(np.median(d))
    return p if p > 0 and np.mean(np.abs(d - p) <= 0.25 * p) >= 0.75 else None


def spike_findings(s: Series, gpu: int, t: np.ndarray, y: np.ndarray, total: float | None, lim: Limits,
                   now: float) -> list[Finding]:
    found = spikes(t, y, total)
    if not found:
        return []
    times = [float(t[i]) for i, _ in found]
    peak_i, base = max(found, key=lambda f: y[f[0]] - f[1])
    delta = y[peak_i] - base
    recent = s.running and now - times[-1] <= lim.hold_s
    period = periodic(times)
    if period is None:
        msg = (f"GPU {gpu}: {len(found)} transient VRAM spike(s); the largest reached {gib(y[peak_i])}, "
               f"+{gib(delta)} above the {gib(base)} baseline"
               + (f" ({100 * y[peak_i] / total:.0f}% of {gib(total)})" if total else ""))
        if peak_i < HISTORY:  # no batch to blame yet: the job was starting (loading, first batches)
            sug = "a peak while the job started, above the level it then held; if it nears capacity, "
        else:
            sug = f"a one-off peak: check the longest batches (cutoff_len {s.config.get('cutoff_len', '?')}); if it recurs, "
        sug += advice.memory_relief(s)
        return [Finding("vram_spike", "warning", gpu, times, step_at(s, times[-1]), msg, sug, recent)]
    g = advice.ga(s)
    steps = _steps_at(s, times)
    every = ""
    sug_parts = []
    if steps is not None:
        sp = float(np.median(np.diff(steps)))
        mb = sp * g
        every = f" (≈{sp:.1f} optimizer steps = {mb:.0f} micro-batches)"
        if g > 1:
            sug_parts.append(f"gradient_accumulation_steps is {g} and the spikes recur every {mb:.0f} micro-batches: "
                             f"try {max(1, g // 2)}")
    elif g > 1:
        sug_parts.append(f"gradient_accumulation_steps is {g}: if the spikes follow optimizer steps, try {g // 2}")
    rb = advice.reduce_bucket(s)
    if rb:
        sug_parts.append(rb)
    if not sug_parts:
        sug_parts.append("spikes at the optimizer step: " + advice.memory_relief(s))
    msg = (f"GPU {gpu}: VRAM spikes by up to +{gib(delta)} (to {gib(y[peak_i])}) every {period:.1f} s{every}; "
           f"{len(found)} spikes")
    return [Finding("vram_periodic_spikes", "warning", gpu, times, step_at(s, times[-1]), msg,
                    ", or ".join(sug_parts), recent)]


def near_oom(s: Series, gpu: int, t: np.ndarray, y: np.ndarray, total: float | None, lim: Limits) -> list[Finding]:
    if not total:
        return []
    above = y >= lim.near_oom_share * total
    times, run, longest = [], 0, 0
    for i, a in enumerate(above):
        run = run + 1 if a else 0
        longest = max(longest, run)
        if run >= 3:  # sustained: three samples in a row
            times.append(float(t[i]))
    if not times:
        return []
    peak = float(y[above].max())
    msg = (f"GPU {gpu}: {gib(peak)} of {gib(total)} in use ({100 * peak / total:.1f}%, over "
           f"{100 * lim.near_oom_share:.0f}% for {longest} samples)")
    return [Finding("vram_near_oom", "critical", gpu, times, step_at(s, times[-1]), msg,
                    "close to out-of-memory: " + advice.memory_relief(s), s.running and bool(above[-1]) and run >= 3)]


def plateau(s: Series, gpu: int, t: np.ndarray, y: np.ndarray, total: float | None) -> list[Finding]:
    """Memory settled after warm-up: the trailing flat stretch of the spike-free baseline covers at
    least half of the run after warm-up."""
    n = len(y)
    if n < 12:
        return []
    k = 9  # a median this wide ignores spikes up to 4 samples long
    smooth = np.median(sliding_window_view(np.concatenate([y[:1].repeat(k - 1), y]), k), axis=1)
    warm = max(5, n // 10)
    level = float(np.median(smooth[warm:]))
    d = np.diff(y[warm:])
    sigma = float(np.median(np.abs(d - np.median(d)))) * 1.4826 / np.sqrt(2)  # sample noise, robust
    band = max(0.03 * level, 0.005 * total if total else 0.0, 32 * 1024**2, 4 * sigma)
    lo = hi = smooth[-1]
    start = n - 1
    while start > warm and max(hi, smooth[start - 1]) - min(lo, smooth[start - 1]) <= band:
        start -= 1
        lo, hi = min(lo, smooth[start]), max(hi, smooth[start])
    if n - start < 10 or t[-1] - t[start] < 0.5 * (t[-1] - t[warm]):
        return []
    share = f" ({100 * level / total:.0f}% of {gib(total)})" if total else ""
    msg = (f"GPU {gpu}: memory settled at {gib(level)}{share} after {t[start] - t[0]:.0f} s and stayed within "
           f"{gib(hi - lo)} for {t[-1] - t[start]:.0f} s: the healthy flat line")
    sug = None
    if total and level < 0.5 * total:
        bs = advice.batch(s)
        sug = f"{gib(total - level)} headroom: per_device_train_batch_size {bs} could go to {bs * 2} for throughput"
    return [Finding("vram_plateau", "info", gpu, [float(t[start]), float(t[-1])], step_at(s, float(t[-1])), msg, sug,
                    s.running)]


def detect(s: Series, lim: Limits, now: float) -> list[Finding]:
    out: list[Finding] = []
    for gpu, samples in sorted(s.memory.items()):
        if not samples:
            continue
        t = np.fromiter((x[0] for x in samples), dtype=np.float64, count=len(samples))
        y = np.fromiter((x[1] for x in samples), dtype=np.float64, count=len(samples))
        totals = [x[2] for x in samples if x[2]]
        total = float(max(totals)) if totals else None
        out += spike_findings(s, gpu, t, y, total, lim, now)
        out += near_oom(s, gpu, t, y, total, lim)
        out += plateau(s, gpu, t, y, total)
    return out
