"""Detectors over the loss curve, the output lines and step progress."""

from __future__ import annotations

import math
import re

import numpy as np

from tunedeck.alerts import advice
from tunedeck.alerts.series import Finding, Limits, Series

# CUDA/HIP OOM, the CPU allocator, Python's MemoryError, Rust's abort (tokenizers) under RLIMIT_AS.
OOM = re.compile(r"out of memory|OutOfMemoryError|can't allocate memory|Cannot allocate memory|^\s*MemoryError\b|"
                 r"memory allocation of \d+ bytes failed", re.IGNORECASE)
OOM_GPU = re.compile(r"GPU (\d+) has a total capacity")
FLUSH = re.compile(r"(\d+) pytorch allocator cache flushes since last step")


def _median(x: list[float], k: int) -> np.ndarray:
    a = np.asarray(x, dtype=np.float64)
    h = k // 2
    return np.array([np.median(a[max(0, i - h): i + h + 1]) for i in range(len(a))])


def losses(s: Series) -> list[tuple[float, int | None, float]]:
    return [(p.t, p.step, p.loss) for p in s.points if p.loss is not None]


def loss_nan(s: Series) -> list[Finding]:
    bad = [(p.t, p.step, "loss" if p.loss is not None and not math.isfinite(p.loss) else "eval_loss")
           for p in s.points
           if (p.loss is not None and not math.isfinite(p.loss)) or (p.eval_loss is not None and not math.isfinite(p.eval_loss))]
    if not bad:
        return []
    _, step0, what = bad[0]
    last = s.points[-1]
    still = last.loss is not None and not math.isfinite(last.loss)
    tips = [x for x in (advice.precision(s), advice.learning_rate(s, 10),
                        "set max_grad_norm: 1.0" if (s.config.get("max_grad_norm") or 1.0) > 1.0 else "") if x]
    return [Finding("loss_nan", "critical", None, [t for t, _, _ in bad], step0,
                    f"{what} became NaN/inf at step {step0} ({len(bad)} point(s))",
                    "; ".join(tips) + "; gradient blow-ups want AMP off (fp16: false)" if not advice.fp16(s) else "; ".join(tips),
                    s.running and still)]


def divergence(s: Series) -> list[Finding]:
    pts = [x for x in losses(s) if math.isfinite(x[2])]
    if len(pts) < 15:
        return []
    # A trailing mean over an even window: an fp16 loss that flips up and down every step averages out.
    sm = np.convolve([x[2] for x in pts], np.ones(10) / 10, mode="valid")
    pts = pts[9:]
    i_min = int(np.argmin(sm))
    lo = sm[i_min]
    tail = sm[i_min:]
    if len(tail) < 5:
        return []
    over = [i_min + i for i, v in enumerate(tail) if v >= max(1.5 * lo, lo + 0.3)]
    if not over or np.mean(np.diff(tail) > 0) < 0.5:
        return []
    first = over[0]
    msg = (f"loss diverging: smoothed {sm[-1]:.3g} against a minimum of {lo:.3g} at step {pts[i_min][1]} "
           f"(×{sm[-1] / lo:.1f})" if lo > 0 else f"loss diverging: {sm[-1]:.3g} from {lo:.3g}")
    tips = [advice.learning_rate(s, 4), "add warmup_ratio: 0.1" if not (s.config.get("warmup_ratio") or s.config.get("warmup_steps")) else "",
            advice.precision(s) or "gradient blow-ups want AMP off (fp16/bf16 false) to check"]
    return [Finding("loss_divergence", "critical", None, [pts[i][0] for i in over], pts[first][1], msg,
                    "; ".join(x for x in tips if x), s.running and sm[-1] >= max(1.5 * lo, lo + 0.3))]


def oscillation(s: Series) -> list[Finding]:
    pts = [x for x in losses(s) if math.isfinite(x[2])]
    if len(pts) < 20:
        return []
    pts = pts[-60:]
    y = np.array([x[2] for x in pts])
    resid = y - _median(list(y), 7)
    level = float(np.median(np.abs(y)))
    rel = float(np.std(resid) / level) if level > 0 else 0.0
    d = np.diff(y)
    alt = float(np.mean(d[1:] * d[:-1] < 0)) if len(d) > 2 else 0.0
    if rel < 0.15 or alt < 0.6:
        return []
    msg = (f"loss oscillates: step-to-step swings of ±{100 * rel:.0f}% around {level:.3g}, the direction "
           f"flipping on {100 * alt:.0f}% of the last {len(pts)} points")
    sug = advice.precision(s) or (f"{advice.learning_rate(s, 2)}, or raise gradient_accumulation_steps from "
                                  f"{advice.ga(s)} to {advice.ga(s) * 2} for a steadier gradient")
    return [Finding("loss_oscillation", "warning", None, [x[0] for x in pts], pts[-1][1], msg, sug, s.running)]


def _step_before(s: Series, t: float) -> int | None:
    prior = [p.step for p in s.points if p.step is not None and p.t <= t]
    return prior[-1] if prior else None


def oom(s: Series) -> list[Finding]:
    hits = [(t, line) for t, line in s.logs if OOM.search(line)]
    if not hits:
        return []
    t, line = hits[0]
    gpu = None
    m = next((OOM_GPU.search(x) for _, x in hits if OOM_GPU.search(x)), None)
    if m:
        local = int(m.group(1))
        gpu = s.devices[local] if local < len(s.devices) else local
    elif not s.devices:
        gpu = -1 if s.memory.get(-1) else None
    return [Finding("oom", "critical", gpu, [x[0] for x in hits], _step_before(s, t),
                    f"out of memory in the trainer output: {line.strip()[:300]}",
                    advice.memory_relief(s), s.running)]


def alloc_flush(s: Series, lim: Limits, now: float) -> list[Finding]:
    hits = [(t, int(m.group(1))) for t, line in s.logs if (m := FLUSH.search(line))]
    if not hits:
        return []
    worst = max(n for _, n in hits)
    tips = [x for x in (advice.prefetch_bucket(s), advice.reduce_bucket(s)) if x]
    tips.append(advice.smaller_batch(s))
    return [Finding("alloc_flush", "warning", s.devices[0] if s.devices else None, [t for t, _ in hits], _step_before(s, hits[-1][0]),
                    f"DeepSpeed flushed the PyTorch allocator cache {len(hits)} time(s), up to {worst} per step: "
                    "memory is fragmented at the limit and every flush stalls the step",
                    "; ".join(tips), s.running and now - hits[-1][0] <= lim.hold_s)]


def stall(s: Series, lim: Limits, now: float) -> list[Finding]:
    pts = [p for p in s.points if p.step is not None]
    if len(pts) < 3:
        return []
    t = np.array([p.t for p in pts])
    usual = float(np.median(np.diff(t)))
    thr = max(10 * usual, lim.stall_min_s)
    # The process lived as long as the memory sampler kept reporting (or, live, until now).
    alive_until = max((xs[-1][0] for xs in s.memory.values() if xs), default=t[-1])
    if s.running:
        alive_until = max(alive_until, now)
    gaps = [(t[i], t[i + 1]) for i in range(len(t) - 1) if t[i + 1] - t[i] > thr]
    ongoing = alive_until - t[-1] > thr
    if ongoing:
        gaps.append((t[-1], alive_until))
    if not gaps:
        return []
    a, b = gaps[-1]
    z = advice.zero(s)
    if z.get("overlap_comm") is True or z.get("contiguous_gradients") is False:
        sug = ("possible RCCL/NCCL deadlock: set zero_optimization.overlap_comm: false and contiguous_gradients: true, "
               "then rerun with NCCL_DEBUG=INFO to see the stuck collective")
    else:
        sug = "possible collective-communication hang: rerun with NCCL_DEBUG=INFO and py-spy dump the workers"
    return [Finding("stall", "critical", None, [x[0] + thr for x in gaps], _step_before(s, a),
                    f"no step progress for {b - a:.0f} s after step {_step_before(s, a)} "
                    f"(a step usually takes {usual:.1f} s) while the process lived", sug, s.running and ongoing)]


def detect(s: Series, lim: Limits, now: float) -> list[Finding]:
    return [*loss_nan(s), *divergence(s), *oscillation(s), *oom(s), *alloc_flush(s, lim, now), *stall(s, lim, now)]
