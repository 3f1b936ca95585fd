"""Detectors over the loss curve, the output lines and step progress.

`Training` consumes a job's points and output lines in order and keeps bounded state (the last
points of the smoothing windows, the loss minimum so far, running counts); what it reports does
not depend on how the points were chunked."""

from __future__ import annotations

import itertools
import math
import re
from collections import deque
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tunedeck.alerts import advice
from tunedeck.alerts.series import (
    KEEP,
    Finding,
    Judging,
    Limits,
    Occurrences,
    Point,
    Series,
    Steps,
    median,
)

# CUDA/HIP OOM, the CPU allocator, Python's MemoryError, Rust's abort (tokenizers) under RLIMIT_AS, and
# a thread whose stack no longer fits in the address space (which of these comes first is chance).
OOM = re.compile(
    r"out of memory|OutOfMemoryError|can't allocate memory|Cannot allocate memory|^\s*MemoryError\b|"
    r"memory allocation of \d+ bytes failed|can't start new thread",
    re.IGNORECASE,
)
OOM_GPU = re.compile(r"GPU (\d+) has a total capacity")
FLUSH = re.compile(r"(\d+) pytorch allocator cache flushes since last step")
SAVE = re.compile(r"Saving model checkpoint to")  # the Trainer's line as each checkpoint save begins
# DeepSpeed's fp16 loss scaler, on rank 0, for each optimizer step it skips (fp16/loss_scaler.py).
OVERFLOW = re.compile(
    r"\[deepspeed\] OVERFLOW! Rank \d+ Skipping step\.(?: Attempted loss scale: \d+, reducing to (\d+))?"
)


SMOOTH = 10  # points in the divergence's trailing mean: an fp16 loss flipping every step averages out
FIRST_MEAN = 4  # points in the first mean (an even count: a loss flipping every step averages out)
RECENT = 60  # points a flat loss under a learning rate of about 0 is judged on, at most
SWING_PERIOD = 12  # the longest swing looked for, in logged points
# An oscillation is a swing that keeps on: judged on the last SWING_WINDOW logged losses (8 of the
# longest swings), once MIN_SWING_POINTS came (5 of them). Noise puts SWING_SHARE of its power into one
# sine by chance the more often the fewer points it is judged on, and live it is judged again at every
# point: judged on the last 60 points from the 36th on, 8 of 100 runs of 400 points of white noise
# of 6 % (logging_steps 1) got a warning at some point, and from the 60th on 39 of 300 runs of 600
# points of 20 % noise; on these windows none of 400 and none of 300 did.
SWING_WINDOW = 8 * SWING_PERIOD
MIN_SWING_POINTS = 5 * SWING_PERIOD
SWING_MIN = 0.06  # the residual's spread against the level below which a swing is not worth a warning
SWING_SHARE = 0.45  # the share of the residual one sine must carry
INTERVALS = 256  # step intervals a step's usual duration is the median of
SETTLE = 8  # intervals seen before each new one is judged on arrival
# A stall is judged in optimizer steps, whatever logging_steps is: a gap between two logged points
# that lie d steps apart holds d steps, so the longest it can have gone without step progress is the
# gap less d - 1 usual steps (the whole gap when every step is logged). A checkpoint save or an
# evaluation inside the gap may take longer: a save is allowed SAVE_BARS bars more (ZeRO-3 gathers
# and writes the whole model), an evaluation twice the longest one seen (EVAL_BARS bars before any).
SAVE_BARS = 5
EVAL_BARS = 5
# Gradients that are exactly zero: a trained network's never are (a LoRA's B starts at zero, its A's
# gradient does not), so a few logged points of them in a row are evidence enough, on a short run too:
# the weights no longer change (a learning rate that wrecked them, or nothing trainable).
NO_GRAD_POINTS = 3
CHANCE_SHARE = 0.01  # a loss within 1 % of ln(vocabulary) is the uniform guess
# fp16 overflow: the loss scaler starts high (2^16, or 2^32 by default) and halves it on each overflow
# until the gradients fit, skipping those first steps by design; past OVERFLOW_AFTER steps a skip is
# a step the weights did not take. OVERFLOW_MIN skips and OVERFLOW_SHARE of the steps since are a
# warning (a healthy run halves its scale about once in scale_window = 1000 steps), as is a scale
# down at its floor (min_loss_scale) at any time: gradients overflow fp16 even unscaled.
OVERFLOW_AFTER = 20
OVERFLOW_MIN = 10
OVERFLOW_SHARE = 0.02
# A stuck loss: a flat line where the run began, or a frozen one after it came down. Flat is a spread of
# at most STUCK_SPREAD of its level over STUCK_POINTS logged points in a row: a model that learns moves its
# loss by more than that from one mini-batch to the next (several %, ~1 % even averaged over 50 steps),
# while one wrecked by a huge learning rate predicts the same thing for every input (the real tiny-model
# run at learning_rate 1, tests/alerts/traces/stuck_lr1, sits within ±0.25 %). Where the run began is a
# level of at least STUCK_HIGH of the lowest of the first EARLY_LOSS losses (the lowest: a wrecked model
# may first log a loss above the one it gets stuck at). A loss that came down and then levels off is a
# plateau (the demo's tiny model levels off at 81 % of its start, within 0.13-0.2 %), so below STUCK_HIGH
# only a frozen line counts: a spread of at most STUCK_FROZEN (updates that stopped: the independent
# corpus, tests/alerts/realistic.py, freezes runs mid-way), at a level of at least STUCK_FLOOR of the
# start (under it the run converged).
STUCK_POINTS = 20
STUCK_SPREAD = 0.005
STUCK_HIGH = 0.9
STUCK_FROZEN = 0.001
STUCK_FLOOR = 0.3
EARLY_LOSS = 5
# A flat loss under a learning rate of about 0 (a scheduler mistake, a warm-up far longer than the run,
# learning_rate 0): batch noise often exceeds the STUCK_SPREAD band, so flat is judged against the
# noise instead: over the last STUCK_POINTS to RECENT logged losses, the fitted slope is not LR_SIGMAS
# standard errors below zero, while the learning rate the scheduler gave peaked so far at no more than
# LR_TINY of the configured learning_rate (logged at STUCK_POINTS points at least), or the configured
# one is itself FAR_BELOW under the usual range of the finetuning type (advice.USUAL_LR).
LR_TINY = 0.01
LR_SIGMAS = 3.0
LR_DEFAULT = 5e-5  # the Trainer's learning_rate when train.yaml sets none
# Overfitting: after its lowest, the eval loss stands OVERFIT_RISE above it at OVERFIT_EVALS evals in a
# row (the last of them), and 4 of its noise's sigmas, now and when the lowest came (from the MAD of the last evals' second
# differences, which neither a steady trend nor one that bends at the turn inflates), while the train
# loss (the median of the last 5 points at each eval) fell by OVERFIT_FALL since the lowest eval and
# since the eval after it. An eval loss that comes back
# below its lowest was swinging, not turning: what it told before is withdrawn.
OVERFIT_RISE = 0.05
OVERFIT_EVALS = 3
OVERFIT_FALL = 0.02


def swings(y: np.ndarray) -> tuple[float, float, int] | None:
    """(relative amplitude, level, period in points) when the loss swings up and down around its
    trend: what is left after a running median over one longest swing (it follows a falling,
    climbing or jumping loss, not a swing; judged where its window is whole) is large against the
    level, and one sine of a period from 2 to SWING_PERIOD points carries most of it. Noise of any
    size spreads over every period, so no one sine carries much of it. The median's window holds an
    even count (SWING_PERIOD points: h before the point judged, it and h - 1 after): over an odd one a
    loss that flips every point has one more point on the side of the one judged, the median is about
    that point's own height, and the swing is taken out with the trend (fp16 runs flipping every
    logged point went unfound)."""
    h = SWING_PERIOD // 2
    if len(y) < 2 * h + SWING_PERIOD:
        return None
    resid = y[h:-h] - np.median(sliding_window_view(y[:-1], 2 * h), axis=1)
    level = median(np.abs(y))
    rel = float(np.std(resid) / level) if level else 0.0  # a median of magnitudes: never negative
    if rel < SWING_MIN:
        return None
    r = resid - resid.mean()
    n = len(r)
    # The strongest period on a fine grid (the spectrum of r padded to 8 times its length).
    f = np.fft.rfftfreq(8 * n)
    amp = np.abs(np.fft.rfft(r, 8 * n))  # its peak is the power's
    band = f >= 1 / SWING_PERIOD
    top = float(f[band][int(np.argmax(amp[band]))])
    x = 2 * np.pi * top * np.arange(n)
    sine = np.column_stack([np.cos(x), np.sin(x)])
    fit = sine @ np.linalg.lstsq(sine, r, rcond=None)[0]
    # The fit is r's projection on the sine: the share of r's power it carries is its own power's.
    share = float(np.dot(fit, fit)) / float(np.dot(r, r))
    return (rel, level, round(1 / top)) if share >= SWING_SHARE else None


class Gap(NamedTuple):
    """The time between two logged points: from a to b, `steps` optimizer steps on from `step`;
    `eval_due`: an evaluation may still come at `step` itself (the point at a was no eval point)."""

    a: float
    b: float
    step: int
    steps: int
    eval_due: bool


def _falls(every: int, lo: int, hi: int) -> bool:
    """Whether a step that is a multiple of `every` lies in lo..hi - 1 (every 0: never)."""
    if every <= 0:
        return False
    first = -(-max(lo, 1) // every) * every
    return first < hi


class Training:
    """A job's loss curve, step progress and output lines."""

    def __init__(self, lim: Limits, config: dict | None = None):
        self.stall_min_s = lim.stall_min_s
        self.save_every, self.eval_every = advice.step_events(config or {})
        self.last: Point | None = None
        self.bad = Occurrences()  # points with a NaN/inf loss or eval loss
        self.bad_first: tuple[int | None, str] = (None, "loss")
        self.finite = 0
        self.recent: deque[tuple[float, int | None, float]] = deque(maxlen=SWING_WINDOW)
        self._ten: deque[float] = deque(maxlen=SMOOTH)
        self.sm = self.lo = self.bar = math.nan  # smoothed loss: now, its minimum so far, diverging above
        self.lo_step: int | None = None
        self.tail = self.ups = 0  # smoothed values since the minimum, and how many of them rose
        self.over = Occurrences()  # points since the minimum with the smoothed loss over the bar
        self.over_step: int | None = None
        self.steps = 0  # points with a step
        self.t_step = math.nan
        self.last_step: int | None = None
        self.intervals: deque[float] = deque(maxlen=INTERVALS)  # seconds per step between logged points
        self.strides: deque[int] = deque(maxlen=INTERVALS)  # steps between logged training points
        self.pending: list[Gap] | None = []  # gaps before SETTLE intervals came
        self.stalls = Occurrences()
        self.last_gap: tuple[float, float, int | None] | None = None  # (start, end, step) of the last stall
        self.after_eval = False  # the last point with a step was an eval point
        self.eval_s = 0.0  # the longest evaluation seen
        self.restarts = 0  # times the steps went back (a run resumed from a checkpoint into the same log)
        self.oom, self.flush = Occurrences(), Occurrences()
        # DeepSpeed prints the flush line only for 1 flush or more, so a start of 0 or 1 reads the same.
        self.oom_line, self.flush_worst = "", 0  # pragma: no mutate
        self.oom_gpu: int | None = None
        self.saves: deque[float] = deque(maxlen=KEEP)  # when checkpoint saves began (the output's lines)
        self.early: list[float] = []  # the first finite losses
        self.flat: list | None = None  # the trailing flat run of losses: [first step, points, min, max]
        self.frozen: list | None = None  # the trailing frozen run (STUCK_FROZEN), same shape
        self.stuck = Occurrences()  # points at which the loss stood stuck
        # (first step, points, level, start, last step, frozen: the frozen rule's rather than the flat band's)
        self.stuck_run: tuple[int | None, int, float, float, int | None, bool] | None = None
        self.stuck_now = False
        self.lr_cfg = advice.number((config or {}).get("learning_rate"))
        usual = advice.usual_lr(config or {})
        ref = LR_DEFAULT if self.lr_cfg is None else self.lr_cfg
        self.lr_slip = usual is not None and ref < usual.low / advice.FAR_BELOW  # 0 included
        self.lr_peak = -math.inf  # the highest learning rate logged so far
        self.lr_n = 0  # points that logged one
        self.lr_recent: deque[float] = deque(maxlen=RECENT)
        self.lr_stuck = Occurrences()  # points at which the loss stood flat under a learning rate of ~0
        self.lr_run: tuple[int | None, int, float, float, float, int | None] | None = None
        self.lr_now = False
        # Eval losses: the lowest (loss, step, train loss then), how many since stood over it by
        # OVERFIT_RISE in a row, and the newest (loss, step, train loss, t).
        self.eval_lo: tuple[float, int | None, float] | None = None
        self.eval_up = 0
        self.eval_next: float | None = None  # the train loss at the first eval after the lowest
        self.eval_lo_sigma = 0.0  # the eval loss's noise when the lowest came
        self.eval_recent: deque[float] = deque(maxlen=32)
        self.eval_last: tuple[float, int | None, float, float] | None = None
        self.overfit = Occurrences()
        self.overflows = Occurrences()  # DeepSpeed's skipped-step lines (fp16 overflow)
        self.loss_scale: int | None = None  # the scale the last of them reduced to
        self.zero_grads = Occurrences()  # points whose grad_norm was exactly 0
        self.zero_run: list | None = None  # the trailing run of them: [first step, points, last loss]

    def feed_point(self, p: Point) -> None:
        self.last = p
        if p.grad_norm is not None and math.isfinite(p.grad_norm):
            if p.grad_norm == 0.0:
                if self.zero_run is None:
                    self.zero_run = [p.step, 0, None]
                self.zero_run[1] += 1
                self.zero_run[2] = p.loss if p.loss is not None else self.zero_run[2]
                self.zero_grads.add(p.t)
            else:
                self.zero_run = None
        if p.lr is not None and math.isfinite(p.lr):
            self.lr_peak, self.lr_n = max(self.lr_peak, p.lr), self.lr_n + 1
            self.lr_recent.append(p.lr)
        bad_loss = p.loss is not None and not math.isfinite(p.loss)
        if bad_loss or (p.eval_loss is not None and not math.isfinite(p.eval_loss)):
            if not self.bad.n:
                self.bad_first = (p.step, "loss" if bad_loss else "eval_loss")
            self.bad.add(p.t)
        if p.loss is not None and math.isfinite(p.loss):
            self._loss(p.t, p.step, p.loss)
        if p.eval_loss is not None and math.isfinite(p.eval_loss):
            self._eval(p.t, p.step, p.eval_loss)
        if p.step is not None:
            # The gap up to an eval point holds the evaluation, however long the eval set takes.
            self._progress(
                p.t, p.step, judge=not (p.eval_loss is not None and p.loss is None), trains=p.loss is not None
            )

    def feed_log(self, t: float, line: str) -> None:
        if OOM.search(line):
            if not self.oom.n:
                self.oom_line = line
            self.oom.add(t)
            m = OOM_GPU.search(line)
            if self.oom_gpu is None and m:
                self.oom_gpu = int(m.group(1))
        if SAVE.search(line):
            self.saves.append(t)
        if "OVERFLOW!" in line and (m := OVERFLOW.search(line)):
            self.overflows.add(t)
            if m.group(1):
                self.loss_scale = int(m.group(1))
        m = FLUSH.search(line)
        if m:
            self.flush.add(t)
            self.flush_worst = max(self.flush_worst, int(m.group(1)))

    @staticmethod
    def _run(f: list | None, step: int | None, loss: float, spread: float) -> list:
        """The run of points within `spread` of their level that `loss` ends: [first step, n, lo, hi]."""
        if f is not None:
            lo, hi = min(f[2], loss), max(f[3], loss)
            if hi - lo <= spread * max(abs(lo), abs(hi)):
                f[1], f[2], f[3] = f[1] + 1, lo, hi
                return f
        return [step, 1, loss, loss]

    def _flat(self, t: float, step: int | None, loss: float) -> None:
        # The list grows one at a time and stops at EARLY_LOSS: `<` and `!=` are the same test here.
        if len(self.early) < EARLY_LOSS:  # pragma: no mutate
            self.early.append(loss)
        self.flat = self._run(self.flat, step, loss, STUCK_SPREAD)
        self.frozen = self._run(self.frozen, step, loss, STUCK_FROZEN)
        start = min(self.early)
        self.stuck_now = False
        for f, floor in ((self.flat, STUCK_HIGH), (self.frozen, STUCK_FLOOR)):
            level = (f[2] + f[3]) / 2
            if f[1] >= STUCK_POINTS and level > 0 and level >= floor * start:
                self.stuck_now = True
                self.stuck.add(t)
                self.stuck_run = (
                    f[0],
                    f[1],
                    level,
                    start,
                    step,
                    f is self.frozen and level < STUCK_HIGH * start,
                )
                break

    def lr_tiny(self) -> bool:
        """Whether the learning rate has been about 0 all along: configured so, or so in the log."""
        ref = LR_DEFAULT if self.lr_cfg is None else self.lr_cfg
        return self.lr_slip or (self.lr_n >= STUCK_POINTS and self.lr_peak <= LR_TINY * ref)

    def _lr_flat(self, t: float, step: int | None) -> None:
        self.lr_now = False
        n = min(len(self.recent), RECENT)
        if n < STUCK_POINTS or not self.lr_tiny():
            return
        skip = len(self.recent) - n  # the last RECENT of the oscillation's longer window
        y = np.fromiter((x[2] for x in itertools.islice(self.recent, skip, None)), np.float64, n)
        x = np.arange(n) - (n - 1) / 2
        sxx = float(np.dot(x, x))
        slope = float(np.dot(x, y)) / sxx
        resid = y - y.mean() - slope * x
        se = math.sqrt(float(np.dot(resid, resid)) / (n - 2) / sxx)
        if slope >= -LR_SIGMAS * se:
            self.lr_now = True
            self.lr_stuck.add(t)
            first = self.recent[skip][1] if self.lr_run is None else self.lr_run[0]
            self.lr_run = (first, n, float(y.mean()), slope, se, step)

    def lr_ramp(self) -> bool:
        """Whether the logged learning rate still climbs (a warm-up ramp): most of its changes rise."""
        d = np.diff(np.array(self.lr_recent))
        return len(d) >= 2 and float(np.mean(d > 0)) >= 0.8

    def _eval(self, t: float, step: int | None, loss: float) -> None:
        # The train loss where the eval stands: the median of the last few points (the trailing mean
        # lags a fast descent, so a loss that later froze higher read as having fallen since).
        near = list(self._ten)[-5:]
        train = median(near) if near else self.sm
        self.eval_last = (loss, step, train, t)
        self.eval_recent.append(loss)
        # Second differences: a trend that bends (falling, then turning up) does not inflate them.
        d = np.diff(np.array(self.eval_recent), 2)
        sigma = 1.4826 * median(np.abs(d - median(d))) / math.sqrt(6) if len(d) >= 3 else 0.0
        if self.eval_lo is None or loss < self.eval_lo[0]:
            # Below the lowest again: what rose before it was a swing, not a turn.
            self.eval_lo, self.eval_up, self.overfit = (loss, step, train), 0, Occurrences()
            self.eval_next, self.eval_lo_sigma = None, sigma
            return
        if self.eval_next is None:
            self.eval_next = train
        lo, _, train_lo = self.eval_lo
        # Against the noise now and where the lowest was set (a dip of the noise then is no turn).
        over = loss >= lo * (1 + OVERFIT_RISE) and loss >= lo + 4 * max(sigma, self.eval_lo_sigma)
        self.eval_up = self.eval_up + 1 if over else 0
        # The train loss fell since the lowest eval, and still falls since the eval after it (a loss
        # that froze or stopped learning right after the lowest eval falls no more).
        fell = min(train_lo, self.eval_next) * (1 - OVERFIT_FALL)
        if self.eval_up >= OVERFIT_EVALS and train <= fell:
            self.overfit.add(t)

    def _loss(self, t: float, step: int | None, loss: float) -> None:
        self._flat(t, step, loss)
        self.finite += 1
        self.recent.append((t, step, loss))
        self._lr_flat(t, step)
        self._ten.append(loss)
        # From the FIRST_MEAN-th point on (the mean of what there is until SMOOTH came): a loss that
        # blows up within the first SMOOTH points has a minimum to diverge from.
        if len(self._ten) < FIRST_MEAN:
            return
        sm = sum(self._ten) / len(self._ten)
        if not sm >= self.lo:  # a new minimum (or the first value): divergence is measured from here
            self.lo, self.lo_step, self.tail, self.ups = sm, step, 1, 0
            self.bar = max(1.5 * sm, sm + 0.3)
            self.over, self.over_step = Occurrences(), None
        else:
            self.tail += 1
            self.ups += sm > self.sm
            if sm >= self.bar:
                if not self.over.n:
                    self.over_step = step
                self.over.add(t)
        self.sm = sm

    def _progress(self, t: float, step: int, judge: bool = True, trains: bool = False) -> None:
        self.steps += 1
        last = self.last_step
        if self.steps > 1 and last is not None and (step < last or (step == last and trains)):
            # Back to an earlier step, or a loss logged twice for one: a run resumed from a checkpoint
            # appends to the same log; the gap before it is a new process starting (loading the model),
            # not a step that hung.
            self.restarts += 1
        elif self.steps > 1 and last is not None and judge:
            d = step - last
            gap = Gap(self.t_step, t, last, d, not self.after_eval)
            if d > 0:
                self.intervals.append((t - self.t_step) / d)
                if not self.after_eval:
                    self.strides.append(d)
            if self.pending is None:
                self._judge(gap)
            else:
                self.pending.append(gap)
                if len(self.intervals) >= SETTLE:  # enough intervals to know a usual step
                    for g in self.pending:
                        self._judge(g)
                    self.pending = None
        elif self.steps > 1 and last is not None:  # an eval point: how long evaluating took
            usual = self.usual() if self.intervals else 0.0
            self.eval_s = max(self.eval_s, t - self.t_step - max(0, step - last) * usual)
        self.t_step, self.last_step, self.after_eval = t, step, not judge

    def usual(self) -> float:
        """Seconds per optimizer step, the median over the recent logged intervals."""
        return median(self.intervals) if self.intervals else 0.0

    def stride(self) -> int:
        """Optimizer steps between logged training points (logging_steps, as the log shows it)."""
        return int(median(self.strides)) if self.strides else 1

    def _bar(self) -> float:
        return max(10 * self.usual(), self.stall_min_s)

    def _allowed(self, g: Gap, bar: float) -> float:
        """The bar for a gap that spans steps g.step to g.step + g.steps: more where a checkpoint save
        or an evaluation falls inside it (after the logged step, before the next one)."""
        hi = g.step + max(g.steps, 1)
        if _falls(self.save_every, g.step, hi):
            bar += SAVE_BARS * bar
        if _falls(self.eval_every, g.step if g.eval_due else g.step + 1, hi):
            bar += 2 * self.eval_s if self.eval_s else EVAL_BARS * bar
        return bar

    def _still(self, g: Gap) -> float:
        """The longest the gap can have gone without step progress: less the steps it holds but one."""
        return g.b - g.a - max(0, g.steps - 1) * self.usual()

    def _judge(self, g: Gap) -> None:
        if g.b - g.a <= self.stall_min_s:  # under the bar's floor: no median of the steps needed
            return
        bar = self._allowed(g, self._bar())
        if self._still(g) > bar:
            self.stalls.add(g.a + max(0, g.steps - 1) * self.usual() + bar)
            self.last_gap = (g.a, g.b, g.step)

    def findings(self, j: Judging, alive_until: float | None, host_memory: bool) -> list[Finding]:
        s, steps, lim, now, running = j
        return [
            *self._nan(s, running),
            *self._divergence(s, running),
            *self._oscillation(s, running),
            *self._stuck(s, running),
            *self._no_gradient(s, running),
            *self._overflow(s, steps, running),
            *self._overfit(s, running),
            *self._oom(s, steps, running, host_memory),
            *self._alloc_flush(s, steps, lim, now, running),
            *self._stall(s, now, running, alive_until),
        ]

    def _nan(self, s: Series, running: bool) -> list[Finding]:
        if not self.bad.n:
            return []
        step0, what = self.bad_first
        still = self.last is not None and self.last.loss is not None and not math.isfinite(self.last.loss)
        clip = advice.Tip(
            "set max_grad_norm: 1.0 (gradient blow-ups are clipped; ordinary steps are unchanged)",
            {"max_grad_norm": 1.0},
        )
        tips = [
            advice.precision(s),
            advice.learning_rate(s, 10),
            clip if (s.config.get("max_grad_norm") or 1.0) > 1.0 else "",
        ]
        if not advice.fp16(s):
            amp = "bf16: false" if s.config.get("bf16") is True else "fp16/bf16 false"
            tips.append(f"to tell a gradient blow-up from a precision one, run once with AMP off ({amp})")
        sug, change = advice.combine(tips)
        return [
            Finding(
                "loss_nan",
                "critical",
                None,
                self.bad.times(),
                step0,
                f"{what} became NaN/inf at step {step0} ({self.bad.n} point(s))",
                sug,
                running and still,
                self.bad.n,
                self.bad.first,
                change,
            )
        ]

    def _divergence(self, s: Series, running: bool) -> list[Finding]:
        if self.finite < 15 or self.tail < 5 or not self.over.n or self.ups / (self.tail - 1) < 0.5:
            return []
        lo, sm = self.lo, self.sm
        msg = (
            f"loss diverging: smoothed {sm:.3g} against a minimum of {lo:.3g} at step {self.lo_step} "
            f"(×{sm / lo:.1f})"
            if lo > 0
            else f"loss diverging: {sm:.3g} from {lo:.3g}"
        )
        warmup = advice.Tip(
            "add warmup_ratio: 0.1 (the learning rate ramps up over the first tenth of training: early "
            "updates are gentler, the peak rate comes later)",
            {"warmup_ratio": 0.1},
        )
        tips = [
            advice.learning_rate(s, 4),
            warmup if not (s.config.get("warmup_ratio") or s.config.get("warmup_steps")) else "",
            advice.precision(s) or "gradient blow-ups want AMP off (fp16/bf16 false) to check",
        ]
        sug, change = advice.combine(tips)
        return [
            Finding(
                "loss_divergence",
                "critical",
                None,
                self.over.times(),
                self.over_step,
                msg,
                sug,
                running and sm >= self.bar,
                self.over.n,
                self.over.first,
                change,
            )
        ]

    def _oscillation(self, s: Series, running: bool) -> list[Finding]:
        if self.finite < MIN_SWING_POINTS:
            return []
        pts = list(self.recent)
        swing = swings(np.array([x[2] for x in pts]))
        if swing is None:
            return []
        rel, level, period = swing
        msg = (
            f"loss oscillates: swings of ±{100 * rel:.0f}% around {level:.3g}, up and down about every "
            f"{period} logged points over the last {len(pts)}"
        )
        sug, change = advice.combine(
            [advice.precision(s)]
            if advice.fp16(s)
            else [advice.learning_rate(s, 2), advice.accumulate_more(s)],
            ", or ",
        )
        return [
            Finding(
                "loss_oscillation",
                "warning",
                None,
                [x[0] for x in pts],
                pts[-1][1],
                msg,
                sug,
                running,
                change=change,
            )
        ]

    def _stuck(self, s: Series, running: bool) -> list[Finding]:
        if self.lr_run is not None:  # the cause is known: named rather than the flat band's guess
            return self._lr_stuck(s, running)
        if self.stuck_run is None:
            return []
        step0, n, level, start, last, frozen = self.stuck_run
        tip = advice.frozen() if frozen else advice.unstick(s)
        if frozen:  # after it came down: no longer the start's height, a line that stopped moving
            what = (
                f"loss frozen at {level:.5g} for {n} logged points (steps {step0} to {last}), each within "
                f"{100 * STUCK_FROZEN:.1f}% of the others after it came down from {start:.4g}: the updates stopped "
                "changing the model"
            )
        else:
            what = (
                f"loss stuck at {level:.5g} for {n} logged points (steps {step0} to {last}), not below "
                f"{100 * STUCK_HIGH:.0f}% of where the run began ({start:.4g}): the model is not learning"
            )
        return [
            Finding(
                "loss_stuck",
                "warning",
                None,
                self.stuck.times(),
                step0,
                what,
                tip.text,
                running and self.stuck_now,
                self.stuck.n,
                self.stuck.first,
                tip.change,
            )
        ]

    def _lr_stuck(self, s: Series, running: bool) -> list[Finding]:
        assert self.lr_run is not None
        step0, n, level, slope, se, last = self.lr_run
        per = f"{100 * slope * 100 / level:+.2f}% of its level per 100 points" if level else f"{slope:+.3g}"
        ref = LR_DEFAULT if self.lr_cfg is None else self.lr_cfg
        if self.lr_slip:
            lr = f"learning_rate is {ref:g}"
        else:
            lr = f"the learning rate peaked at {self.lr_peak:.3g}, {100 * self.lr_peak / ref:.2g}% of learning_rate {ref:g}"
        tip = advice.tiny_lr(s, slip=self.lr_slip, ramp=self.lr_ramp(), peak=self.lr_peak)
        return [
            Finding(
                "loss_stuck",
                "warning",
                None,
                self.lr_stuck.times(),
                step0,
                f"loss flat since step {step0} (to step {last}), at {level:.4g} over the last {n} logged points: its slope, {per}, "
                f"is within its noise ({LR_SIGMAS:.0f} standard errors: ±{LR_SIGMAS * 100 * se * 100 / abs(level or 1):.2f}%), "
                f"while {lr}: the weights barely change",
                tip.text,
                running and self.lr_now,
                self.lr_stuck.n,
                self.lr_stuck.first,
                tip.change,
            )
        ]

    def _overflow(self, s: Series, steps: Steps, running: bool) -> list[Finding]:
        if not self.overflows.n:
            return []
        got = (s.ds or {}).get("fp16")
        fp16: dict = got if isinstance(got, dict) else {}
        floor = advice.number(fp16.get("min_loss_scale")) or 1.0
        at_floor = self.loss_scale is not None and self.loss_scale <= floor
        since = steps.reached(OVERFLOW_AFTER)  # past the loss scaler's first search
        recent = self.overflows.times()
        late = 0 if since is None else sum(t >= since for t in recent) + self.overflows.n - len(recent)
        span = (steps.step[-1] - OVERFLOW_AFTER) if steps.step else 0
        if not at_floor and not (late >= OVERFLOW_MIN and late >= OVERFLOW_SHARE * max(1, span)):
            return []
        parts = []
        if late >= OVERFLOW_MIN and late >= OVERFLOW_SHARE * max(1, span):
            scale = f"; loss scale now {self.loss_scale}" if self.loss_scale is not None else ""
            parts.append(
                f"{late} optimizer steps skipped for fp16 overflow since step {OVERFLOW_AFTER} "
                f"({100 * late / max(1, span):.0f}% of the {max(1, span)} steps since{scale}): each is a step "
                "the weights did not take"
            )
        if at_floor:
            parts.append(
                f"the fp16 loss scale fell to its floor (min_loss_scale {floor:g}) after {self.overflows.n} "
                "overflows: the gradients overflow fp16 even unscaled, and every such step is skipped"
            )
        msg = "; ".join(parts)
        text, change = advice.combine([advice.precision(s), advice.learning_rate(s, 2)])
        return [
            Finding(
                "fp16_overflow",
                "warning",
                None,
                recent,
                steps.step_at(recent[-1]),
                msg,
                text,
                running,
                self.overflows.n,
                self.overflows.first,
                change,
            )
        ]

    def _no_gradient(self, s: Series, running: bool) -> list[Finding]:
        if self.zero_run is None or self.zero_run[1] < NO_GRAD_POINTS:
            return []
        step0, n, loss = self.zero_run
        msg = f"grad_norm 0.0 at every logged step since step {step0} ({n} points): the weights no longer change"
        if (
            loss is not None
            and s.vocab_size
            and abs(loss - math.log(s.vocab_size)) <= CHANCE_SHARE * math.log(s.vocab_size)
        ):
            msg += (
                f", and the loss stands at {loss:.4g} = ln({s.vocab_size}), a uniform guess over the "
                "model's vocabulary: the model outputs noise"
            )
        tip = advice.revive(s)
        return [
            Finding(
                "no_gradient",
                "critical",
                None,
                self.zero_grads.times(),
                step0,
                msg,
                tip.text,
                running,
                self.zero_grads.n,
                self.zero_grads.first,
                tip.change,
            )
        ]

    def _overfit(self, s: Series, running: bool) -> list[Finding]:
        if not self.overfit.n or self.eval_lo is None or self.eval_last is None:
            return []
        lo, at, train_lo = self.eval_lo
        now, step, train, _ = self.eval_last
        epochs = advice.number(s.config.get("num_train_epochs"))
        change = None
        keep = f"the checkpoint nearest step {at} holds the best model so far"
        if epochs and at and step and not running and not s.config.get("max_steps"):
            fewer = round(epochs * at / step, 2)
            change = {"num_train_epochs": fewer}
            keep += (
                f"; train for num_train_epochs {fewer} instead of {epochs:g} (where the eval loss was lowest)"
            )
        msg = (
            f"eval loss rising while train loss falls: eval_loss {lo:.4g} at step {at} (its lowest), now {now:.4g} "
            f"at step {step} (+{100 * (now / lo - 1):.0f}%); train loss {train_lo:.4g} -> {train:.4g}"
        )
        sug = (
            f"the model is fitting the training set and no longer generalising: {keep}; more or more varied "
            "data, a lower learning_rate or a higher lora_dropout also delay it"
        )
        return [
            Finding(
                "loss_overfit",
                "warning",
                None,
                self.overfit.times(),
                at,
                msg,
                sug,
                running and self.eval_up >= OVERFIT_EVALS,
                self.overfit.n,
                self.overfit.first,
                change,
            )
        ]

    def _oom(self, s: Series, steps: Steps, running: bool, host_memory: bool) -> list[Finding]:
        first = self.oom.first  # None until an out-of-memory line came
        if first is None:
            return []
        gpu = None
        if self.oom_gpu is not None:
            local = self.oom_gpu
            gpu = s.devices[local] if local < len(s.devices) else local
        elif not s.devices:
            gpu = -1 if host_memory else None
        relief = advice.memory_relief(s)
        return [
            Finding(
                "oom",
                "critical",
                gpu,
                self.oom.times(),
                steps.before(first),
                f"out of memory in the trainer output: {self.oom_line.strip()[:300]}",
                relief.text,
                running,
                self.oom.n,
                first,
                relief.change,
            )
        ]

    def _alloc_flush(self, s: Series, steps: Steps, lim: Limits, now: float, running: bool) -> list[Finding]:
        if not self.flush.n:
            return []
        sug, change = advice.combine(
            [advice.prefetch_bucket(s), advice.reduce_bucket(s), advice.smaller_batch(s)]
        )
        last = self.flush.recent[-1]
        return [
            Finding(
                "alloc_flush",
                "warning",
                s.devices[0] if s.devices else None,
                self.flush.times(),
                steps.before(last),
                f"DeepSpeed flushed the PyTorch allocator cache {self.flush.n} time(s), up to "
                f"{self.flush_worst} per step: memory is fragmented at the limit and every flush stalls the step",
                sug,
                running and now - last <= lim.hold_s,
                self.flush.n,
                self.flush.first,
                change,
            )
        ]

    def _stall(self, s: Series, now: float, running: bool, alive_until: float | None) -> list[Finding]:
        if self.steps < 3:
            return []
        usual = self.usual()
        times, count, last = self.stalls.times(), self.stalls.n, self.last_gap
        for g in self.pending or ():  # too few steps yet to judge for good: judged on what there is
            bar = self._allowed(g, self._bar())
            if self._still(g) > bar:
                times.append(g.a + max(0, g.steps - 1) * usual + bar)
                count, last = count + 1, (g.a, g.b, g.step)
        # The process lived as long as the memory sampler kept reporting (or, live, until now). Not
        # after the log restarted (a resumed run appended to it), unless live: an imported log's times
        # come from elapsed_time, which restarts with each process, so they lose the sampler's clock.
        alive = self.t_step if alive_until is None or (self.restarts and not running) else alive_until
        if running:
            alive = max(alive, now)
        # Since the last point: the next one is due after one stride of steps (and whatever save or
        # evaluation falls before it).
        assert self.last_step is not None  # (steps >= 3)
        nxt = Gap(self.t_step, alive, self.last_step, self.stride(), not self.after_eval)
        bar = self._allowed(nxt, self._bar())
        ongoing = self._still(nxt) > bar
        if ongoing:
            times.append(self.t_step + max(0, nxt.steps - 1) * usual + bar)
            count, last = count + 1, (self.t_step, alive, self.last_step)
        if last is None:
            return []
        a, b, step = last
        k = self.stride()
        every = f"; the log has a point every {k} steps" if k > 1 else ""
        z = advice.zero(s)
        if z.get("overlap_comm") is True or z.get("contiguous_gradients") is False:
            sug = (
                "possible RCCL/NCCL deadlock: set zero_optimization.overlap_comm: false and contiguous_gradients: "
                "true, then rerun with NCCL_DEBUG=INFO to see the stuck collective"
            )
        else:
            sug = (
                "possible collective-communication hang: see where each rank waits in the stack dumps taken "
                "as this opened (GET /api/jobs/<id>/stacks), and rerun with NCCL_DEBUG=INFO"
            )
        return [
            Finding(
                "stall",
                "critical",
                None,
                times,
                step,
                f"no step progress for {b - a:.0f} s after step {step} "
                f"(a step usually takes {usual:.1f} s{every}) while the process lived",
                sug,
                running and ongoing,
                count,
                self.stalls.first if self.stalls.n else times[0],
            )
        ]
