"""A labelled corpus of memory and loss traces, generated (deterministic per seed).

Each trace is a tunedeck.alerts.Series plus the set of alert kinds that must fire on it, and the
times of the spikes it holds. `python -m tests.alerts.corpus OUT_DIR` also writes every trace as
a run folder (trainer_log.jsonl, memory.csv, train.yaml, train.log) for `tunedeck analyze`.
"""

from __future__ import annotations

import csv
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from tunedeck.alerts import Point, Series

GiB = 1024**3
TOTAL = 192 * GiB  # an MI300X
T0 = 1_800_000_000.0
MICRO_S = 2.0  # one micro-batch


@dataclass
class Trace:
    name: str
    series: Series
    labels: set[str]
    spike_times: list[float] = field(default_factory=list)


def _config(ga: int = 2, fp16: bool = False, **kw) -> dict:
    return {
        "stage": "sft",
        "finetuning_type": "lora",
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": ga,
        "learning_rate": 1e-4,
        "cutoff_len": 2048,
        "bf16": not fp16,
        "fp16": fp16,
        **kw,
    }


DS = {
    "zero_optimization": {
        "stage": 3,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e8,
        "stage3_prefetch_bucket_size": 5e8,
    }
}


def _memory(rng: np.random.Generator, n: int, level: float, warm: int = 30) -> np.ndarray:
    """Warm-up climb to `level`, then a flat line with small noise."""
    y = np.full(n, level) + rng.normal(0, 0.1 * GiB, n)
    y[:warm] = np.linspace(2 * GiB, level, warm)
    return y


def _points(
    rng: np.random.Generator, ga: int, dur: float, loss=None, until: float | None = None
) -> list[Point]:
    step_s = ga * MICRO_S
    out, k = [], 1
    while k * step_s <= (until if until is not None else dur):
        t = T0 + k * step_s
        v = loss(k) if loss else 2.5 * math.exp(-k / 60) + 1.0 + rng.normal(0, 0.02)
        out.append(Point(t=t, step=k, loss=float(v)))
        k += 1
    return out


def _series(
    y: np.ndarray,
    points: list[Point],
    cfg: dict,
    ds: dict | None = None,
    logs=(),
    running: bool = True,
    now: float | None = None,
) -> Series:
    t = T0 + np.arange(len(y), dtype=float)
    mem = {0: [(float(a), int(max(b, 0)), TOTAL) for a, b in zip(t, y)]}
    return Series(
        memory=mem,
        points=points,
        logs=list(logs),
        config=cfg,
        ds=ds,
        gpu_names={0: "AMD Instinct MI300X"},
        devices=[0],
        running=running,
        now=now,
    )


def generate(seed: int = 0, n: int = 600) -> list[Trace]:
    rng = np.random.default_rng(seed)
    out: list[Trace] = []
    level = float(rng.uniform(40, 90)) * GiB

    y = _memory(rng, n, level)
    out.append(Trace(f"plateau-{seed}", _series(y, _points(rng, 2, n), _config()), {"vram_plateau"}))

    y = _memory(rng, n, level)
    at = sorted(rng.choice(np.arange(80, n - 10), size=int(rng.integers(1, 3)), replace=False))
    # Into the first 250 samples: the line then stays flat, spike-free, long enough to be a plateau.
    at = sorted({80 + int(i - 80) * 170 // (n - 90) for i in at})
    for i in at:
        y[i] += float(rng.uniform(15, 40)) * GiB
    out.append(
        Trace(
            f"single-spike-{seed}",
            _series(y, _points(rng, 2, n), _config()),
            {"vram_spike", "vram_plateau"},
            [T0 + float(i) for i in at],
        )
    )

    for ga in (2, 4, 8, 16):
        y = _memory(rng, n, level)
        period = ga * MICRO_S
        phase = float(rng.uniform(0, period))
        times = [T0 + 40 + phase + k * period for k in range(int((n - 45) // period))]
        idx = [int(round(tt - T0)) for tt in times if int(round(tt - T0)) < n]
        for i in idx:
            y[i] += float(rng.uniform(18, 25)) * GiB
        out.append(
            Trace(
                f"periodic-ga{ga}-{seed}",
                _series(y, _points(rng, ga, n), _config(ga=ga), DS),
                {"vram_periodic_spikes"},  # spikes to the end: never "the healthy flat line"
                [T0 + float(i) for i in idx],
            )
        )

    # A slow ramp that ends in an out-of-memory error.
    y = _memory(rng, n, level)
    y[60:] = np.linspace(level, 0.985 * TOTAL, n - 60) + rng.normal(0, 0.05 * GiB, n - 60)
    end = T0 + n
    logs = [
        (
            end,
            "torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
            "capacity of 191.98 GiB of which 1.20 GiB is free.",
        )
    ]
    out.append(
        Trace(
            f"ramp-oom-{seed}",
            _series(y, _points(rng, 2, n), _config(), DS, logs, running=False),
            {"vram_near_oom", "oom", "vram_leak"},  # a trend to out-of-memory: the leak it is
        )
    )

    # Fragmentation: reserved memory climbs in steps, DeepSpeed flushes its allocator cache.
    y = _memory(rng, n, 80 * GiB)
    for k, start in enumerate(range(60, n, 40)):
        y[start:] += 6 * GiB
    logs = [
        (
            T0 + s,
            f"[rank0]: {int(rng.integers(1, 6))} pytorch allocator cache flushes since last step. this "
            "happens when there is high memory pressure and is detrimental to performance.",
        )
        for s in range(300, n, 24)
    ]
    out.append(
        Trace(
            f"fragmentation-{seed}",
            _series(y, _points(rng, 2, n), _config(), DS, logs),
            {"alloc_flush", "vram_leak"},  # reserved memory climbing step after step is a trend to OOM too
        )
    )

    # A hang: steps stop at 250 s while the process (and its memory) lives on.
    y = _memory(rng, n, level)
    out.append(
        Trace(
            f"hang-{seed}",
            _series(y, _points(rng, 2, n, until=250), _config(), DS, now=T0 + n),
            {"stall", "vram_plateau"},
        )
    )

    def beside_a_loss(name: str, loss, cfg: dict, kind: str) -> Trace:
        """Healthy memory beside a loss curve that shows `kind` (the memory drawn first)."""
        y = _memory(rng, n, level)
        return Trace(f"{name}-{seed}", _series(y, _points(rng, 2, n, loss=loss), cfg), {kind, "vram_plateau"})

    # fp16 loss oscillation.
    sign = 1 if rng.random() < 0.5 else -1
    osc = lambda k: 2.0 + sign * (-1) ** k * float(rng.uniform(0.4, 0.8)) + rng.normal(0, 0.05)
    out.append(beside_a_loss("fp16-oscillation", osc, _config(fp16=True), "loss_oscillation"))

    # NaN after a while.
    k_nan = int(rng.integers(40, 120))
    nan = lambda k: float("nan") if k >= k_nan else 2.5 * math.exp(-k / 60) + 1.0 + rng.normal(0, 0.02)
    out.append(beside_a_loss("nan", nan, _config(fp16=True), "loss_nan"))

    # Divergence: the loss falls, then climbs away.
    k_div = int(rng.integers(50, 90))
    div = lambda k: (
        (2.5 * math.exp(-k / 30) + 1.0 if k < k_div else 1.0 * math.exp((k - k_div) / 40))
        + rng.normal(0, 0.02)
    )
    out.append(beside_a_loss("divergence", div, _config(learning_rate=5e-4), "loss_divergence"))
    out += hard(rng, seed, n, level)
    out += stuck(np.random.default_rng(10_000 + seed), seed, n)  # its own draws: the rest stay put
    out.append(overfitting(np.random.default_rng(20_000 + seed), seed, n, level))
    out += tiny_lr(np.random.default_rng(30_000 + seed), seed, n)
    out += drift(np.random.default_rng(40_000 + seed), seed, n, level)
    return out


def tiny_lr(rng: np.random.Generator, seed: int, n: int) -> list[Trace]:
    """A loss that hovers with mini-batch noise (too much for the flat band) because the learning rate
    is about 0: the scheduler's rate 0 in the log, learning_rate 0 in the config (no lr column), a
    warm-up far longer than the run. Hard negatives: the same noise under the configured rate, a healthy
    warm-up and cosine decay to 0 whose loss levels off."""
    out = []
    noise = float(rng.uniform(0.02, 0.05))
    level = float(rng.uniform(1.5, 3.0))
    hover = lambda k: level * (1 + rng.normal(0, noise))  # noqa: E731

    def made(name: str, labels: set[str], lr, cfg: dict, loss=hover) -> Trace:
        points = _points(rng, 2, n, loss=loss)
        for p in points:
            p.lr = None if lr is None else float(lr(p.step))
        return Trace(f"{name}-{seed}", _losses(points, cfg), labels)

    out.append(made("lr0-scheduler", {"loss_stuck"}, lambda k: 0.0, _config(lr_scheduler_type="polynomial")))
    out.append(made("lr0-config", {"loss_stuck"}, None, _config(learning_rate=0)))
    ramp = lambda k: 1e-4 * k / 100_000  # noqa: E731
    out.append(made("lr-endless-warmup", {"loss_stuck"}, ramp, _config(warmup_steps=100_000)))
    out.append(made("hovering-at-lr", set(), lambda k: 1e-4, _config()))
    total = n // (2 * MICRO_S)
    cosine = lambda k: 1e-4 * min(1.0, k / 10) * 0.5 * (1 + math.cos(math.pi * k / total))  # noqa: E731
    falls = lambda k: (2.5 * math.exp(-k / 30) + 0.8) * (1 + rng.normal(0, noise))  # noqa: E731
    out.append(made("cosine-to-0", set(), cosine, _config(warmup_steps=10), loss=falls))
    return out


def drift(rng: np.random.Generator, seed: int, n: int, level: float) -> list[Trace]:
    """Four GPUs of one job, each at its own steady offset (rank 0 keeps more, uneven data), one of
    them moving away from the rest: memory kept on that rank only (a slow climb by 6-9 % of the card,
    under what a leak is called at), a rank that starts getting far longer sequences (a step up that
    stays), a process that stopped allocating (a step down). Hard negatives: the same offsets held, and
    all four moving together."""
    out = []
    offsets = rng.uniform(-4, 4, 4) * GiB + np.array([2.0, 0, 0, 0]) * GiB
    k = np.arange(n, dtype=float)

    def made(name: str, labels: set[str], gpu: int = -1, move=None, common=None) -> Trace:
        mem = {}
        for g in range(4):
            y = _memory(rng, n, level + offsets[g])
            if g == gpu:
                y += move
            if common is not None:
                y += common
            mem[g] = [(float(T0 + i), int(max(v, 0)), TOTAL) for i, v in enumerate(y)]
        s = Series(
            memory=mem,
            points=_points(rng, 2, n),
            config=_config(),
            gpu_names={g: "AMD Instinct MI300X" for g in range(4)},
            devices=list(range(4)),
            running=True,
        )
        return Trace(f"{name}-{seed}", s, labels)

    gpu = int(rng.integers(0, 4))
    k0 = float(rng.uniform(200, 300))
    share = float(rng.uniform(0.06, 0.09))
    climb = share * TOTAL * np.clip((k - k0) / (n - k0), 0, 1)
    out.append(made("drift-climb", {"gpu_drift", "vram_plateau"}, gpu, climb))
    step = float(rng.uniform(0.06, 0.15)) * TOTAL * np.clip((k - k0) / 20, 0, 1)
    out.append(made("drift-step-up", {"gpu_drift", "vram_plateau"}, gpu, step))
    out.append(made("drift-step-down", {"gpu_drift", "vram_plateau"}, gpu, -step))
    out.append(made("uneven-steady", {"vram_plateau"}))
    together = 0.08 * TOTAL * np.clip((k - k0) / (n - k0), 0, 1)
    out.append(made("all-rising", set(), common=together))
    return out


def overfitting(rng: np.random.Generator, seed: int, n: int, level: float) -> Trace:
    """The train loss keeps falling; the eval loss, every 10 steps, turns up at a drawn step."""
    y = _memory(rng, n, level)
    points = _points(rng, 2, n)
    turn = int(rng.integers(40, 80))
    for p in [p for p in points if p.step and p.step % 10 == 0]:
        e = 1.6 - 0.003 * min(p.step, turn) + 0.004 * max(0, p.step - turn) + rng.normal(0, 0.01)
        points.append(Point(t=p.t + 0.5, step=p.step, eval_loss=float(e)))
    points.sort(key=lambda p: p.t)
    return Trace(f"overfit-{seed}", _series(y, points, _config()), {"loss_overfit", "vram_plateau"})


def hardware(rng: np.random.Generator, seed: int, n: int) -> list[Trace]:
    """The GPUs' own readings beside a healthy loss with tokens/s: ECC errors that rise during the
    job, correctable ones rising fast, throttling while the tokens/s fall (throttling is the cause
    named, not a bare drop), a lasting drop with no throttling. Hard negatives: errors the GPU had
    before the job, throttling with no drop, a small slowdown."""
    out = []
    mid = int(rng.integers(n // 3, 2 * n // 3))
    tps_base = float(rng.uniform(800, 4000))

    def made(name: str, labels: set[str], *, ue=None, ce=None, throttle=None, slower: float = 0.0) -> Trace:
        t = [T0 + i for i in range(n)]
        cols = {
            "ecc_uncorrectable": ue if ue is not None else [0] * n,
            "ecc_correctable": ce if ce is not None else [0] * n,
            "ecc_blocks": [None] * n,
            "throttle_power": throttle if throttle is not None else [float(rng.uniform(0, 0.03))] * n,
            "throttle_thermal": [0.0] * n,
            "throttle_hbm": [0.0] * n,
            "clock_mhz": [2100.0] * n,
        }
        if ue is not None and ue[-1] > ue[0]:
            cols["ecc_blocks"][ue.index(ue[-1])] = f"UMC=0/{ue[-1] - ue[0]}"
        points = _points(rng, 2, n)
        for p in points:
            p.throughput = tps_base * (1 - (slower if p.t >= T0 + mid else 0.0)) * (1 + rng.normal(0, 0.01))
        s = _losses(points, _config())
        s.hardware = {("gpu-node-1", 0): (t, cols)}
        return Trace(f"{name}-{seed}", s, labels)

    k = int(rng.integers(1, 6))
    out.append(
        made("ecc-uncorrectable", {"gpu_ecc_uncorrectable"}, ue=[0 if i < mid else k for i in range(n)])
    )
    out.append(made("ecc-before-the-job", set(), ue=[k] * n))
    per_min = int(rng.integers(15, 60))
    out.append(
        made(
            "ecc-correctable-fast",
            {"gpu_ecc_correctable"},
            ce=[0 if i < mid else per_min * (i - mid) // 60 for i in range(n)],
        )
    )
    share = float(rng.uniform(0.3, 0.8))
    throttled = [0.0 if i < mid else share for i in range(n)]
    out.append(
        made("throttle-slow", {"gpu_throttle"}, throttle=throttled, slower=float(rng.uniform(0.25, 0.5)))
    )
    out.append(made("throttle-no-drop", set(), throttle=throttled))
    out.append(made("slow-not-throttled", {"throughput_drop"}, slower=float(rng.uniform(0.35, 0.6))))
    out.append(made("a-little-slower", set(), slower=float(rng.uniform(0.05, 0.2))))
    return out


def _losses(points: list[Point], cfg: dict) -> Series:
    return Series(points=points, config=cfg, running=True)


def stuck(rng: np.random.Generator, seed: int, n: int) -> list[Trace]:
    """Losses that stop moving. A model wrecked by a huge learning rate predicts a uniform distribution,
    whose loss is ln(vocabulary) exactly, step after step (the tiny demo model at lr=200 sat at
    6.1225 = ln 456 for 37 steps). Hard negatives: a converged run's flat tail far below its start,
    a loss that hovers with ordinary mini-batch noise, a flat warm-up shorter than the window."""
    out = []
    vocab = float(rng.choice([456, 32000, 151646]))
    wrecked = int(rng.integers(1, 4))  # logged points before the weights are gone
    lr200 = lambda k: 1.4 * math.log(vocab) if k <= wrecked else math.log(vocab)  # noqa: E731
    out.append(
        Trace(
            f"stuck-lr200-{seed}",
            _losses(_points(rng, 2, n, loss=lr200), _config(learning_rate=200.0)),
            {"loss_stuck"},
        )
    )
    fall = int(rng.integers(5, 20))
    collapse = lambda k: (  # noqa: E731
        (1.05 - 0.01 * k) * math.log(vocab) if k < fall else math.log(vocab) * (1 + rng.normal(0, 0.0005))
    )
    out.append(
        Trace(
            f"stuck-collapse-{seed}",
            _losses(_points(rng, 2, n, loss=collapse), _config(learning_rate=5e-2)),
            {"loss_stuck"},
        )
    )
    low = lambda k: 2.5 * math.exp(-k / 10) + 0.3 * (1 + rng.normal(0, 0.001))  # noqa: E731
    hover = lambda k: 1.2 * (1 + rng.normal(0, 0.02))  # noqa: E731
    warm = int(rng.integers(8, 18))
    slow = lambda k: 2.4 if k <= warm else 2.4 * math.exp(-(k - warm) / 40) + 0.9  # noqa: E731
    for name, loss in (("converged-flat", low), ("hovering", hover), ("flat-warmup", slow)):
        out.append(Trace(f"{name}-{seed}", _losses(_points(rng, 2, n, loss=loss), _config()), set()))
    return out


def hard(rng: np.random.Generator, seed: int, n: int, level: float) -> list[Trace]:
    """Traces closer to real runs: noisier lines, a lasting step up at the first eval, bumps under
    the spike threshold, jittered two-sample-wide periodic spikes, a small-batch noisy loss."""
    out = []
    y = _memory(rng, n, level) + rng.normal(0, 0.4 * GiB, n)
    y[250:] += 4 * GiB  # eval buffers allocated once, then kept by the caching allocator
    out.append(Trace(f"eval-step-{seed}", _series(y, _points(rng, 2, n), _config()), {"vram_plateau"}))

    y = _memory(rng, n, level) + rng.normal(0, 0.5 * GiB, n)
    for i in rng.choice(np.arange(60, n), size=8, replace=False):
        y[i] += 2 * GiB  # under 2 % of 192 GiB: noise, not a spike
    noisy = lambda k: (2.5 * math.exp(-k / 60) + 1.0) * (1 + rng.normal(0, 0.08))  # noqa: E731
    out.append(
        Trace(
            f"noisy-healthy-{seed}", _series(y, _points(rng, 2, n, loss=noisy), _config()), {"vram_plateau"}
        )
    )

    ga = int(rng.choice([4, 8]))
    y = _memory(rng, n, level) + rng.normal(0, 0.3 * GiB, n)
    t, idx = 45.0, []
    while t < n - 3:
        i = int(t)
        y[i : i + 2] += float(rng.uniform(12, 20)) * GiB
        idx.append(i)
        t += ga * MICRO_S * float(rng.uniform(0.9, 1.1))
    out.append(
        Trace(
            f"jittered-periodic-ga{ga}-{seed}",
            _series(y, _points(rng, ga, n), _config(ga=ga), DS),
            {"vram_periodic_spikes"},
        )
    )
    return out


def corpus(seeds=range(5)) -> list[Trace]:
    return [tr for s in seeds for tr in generate(s)]


def hardware_corpus(seeds=range(5), n: int = 600) -> list[Trace]:
    """The hardware traces, apart: their readings are columns of the memory samples, which the
    memory-only paths (a run folder's CSV, the row tests) do not carry."""
    return [tr for s in seeds for tr in hardware(np.random.default_rng(20_000 + s), s, n)]


def gradients(rng: np.random.Generator, seed: int) -> list[Trace]:
    """Short runs judged on their gradients (tunedeck_log.jsonl's grad_norm, line for line). The demo
    model at learning_rate 1e8, 8 steps logged each: grad_norm 0.67, 0.61, then 0.0 at every step, the
    loss at 6.1225 = ln 456 from step 3 on; 8 points, too few for loss_stuck. Hard negatives: a
    healthy short run's small gradients, and two zeros in a row that the run recovers from."""
    vocab = int(rng.choice([456, 32000, 151646]))
    n = int(rng.integers(6, 12))
    wrecked = int(rng.integers(1, 3))  # logged points before the weights are gone

    def run(name: str, grad, loss, labels: set[str], **cfg) -> Trace:
        pts = [
            Point(t=T0 + 8.0 * k, step=k, loss=float(loss(k)), grad_norm=float(grad(k)))
            for k in range(1, n + 1)
        ]
        series = Series(points=pts, config=_config(**cfg), running=False, vocab_size=vocab)
        return Trace(f"{name}-{seed}", series, labels)

    chance = math.log(vocab)
    return [
        run(
            "no-gradient-lr1e8",
            lambda k: 0.6 if k <= wrecked else 0.0,
            lambda k: 1.01 * chance if k <= wrecked else chance,
            {"no_gradient"},
            learning_rate=1e8,
        ),
        run(
            "no-gradient-frozen",  # nothing trainable: zero from the first step, the loss where it began
            lambda k: 0.0,
            lambda k: 0.5 * chance,
            {"no_gradient"},
        ),
        run("small-gradients", lambda k: float(rng.uniform(1e-4, 1e-3)), lambda k: 2.5 - 0.05 * k, set()),
        run(
            "two-zeros-then-back",
            lambda k: 0.0 if k in (2, 3) else float(rng.uniform(0.2, 0.8)),
            lambda k: 2.5 - 0.05 * k,
            set(),
        ),
    ]


def overflow(rng: np.random.Generator, seed: int) -> list[Trace]:
    """fp16 runs under DeepSpeed's loss scaler: its skipped-step lines among the output. Each run
    starts at 2^16 and halves the scale on the first few steps (the search, by design). Positives:
    skips that keep coming after it (one in 5 to 10 steps), and a scale driven down to its floor.
    Hard negatives: the search alone, and the search plus a rare skip (about one per scale_window)."""
    n = 300
    pts = [Point(t=T0 + 8.0 * k, step=k, loss=2.5 * math.exp(-k / 60) + 1.0) for k in range(1, n + 1)]
    search = int(rng.integers(2, 7))

    def lines(at_steps: list[int], floor: int = 1) -> list[tuple[float, str]]:
        out, scale = [], 65536
        for k in at_steps:
            nxt = max(floor, scale // 2)
            out.append(
                (
                    T0 + 8.0 * k + 3.0,
                    f"[2026-11-30 10:00:{k % 60:02d},000] [INFO] [loss_scaler.py:183:update_scale] [deepspeed] "
                    f"OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to {nxt}",
                )
            )
            scale = nxt
        return out

    def run(name: str, at_steps: list[int], labels: set[str], floor: int = 1) -> Trace:
        logs = lines(at_steps, floor)
        series = Series(points=pts, logs=logs, config=_config(fp16=True), ds=DS, running=False)
        return Trace(f"{name}-{seed}", series, labels)

    every = int(rng.integers(5, 11))
    first = list(range(1, search + 1))
    return [
        # (the scaler raises the scale again between skips: it hovers instead of falling to the floor)
        run("overflow-keeps-skipping", first + list(range(40, n, every)), {"fp16_overflow"}, floor=512),
        run("overflow-to-the-floor", list(range(1, 18)), {"fp16_overflow"}),  # 65536 halved 16 times: 1
        run("overflow-search-only", first, set()),
        run("overflow-rare", first + [int(rng.integers(100, 290))], set()),
    ]


def gradient_corpus(seeds=range(5)) -> list[Trace]:
    """The gradient and loss-scaler traces, apart: grad_norm is not in trainer_log.jsonl, which the run-folder paths
    (write_run, imports) carry."""
    return [
        tr
        for s in seeds
        for rng in [np.random.default_rng(30_000 + s)]
        for tr in gradients(rng, s) + overflow(rng, s)
    ]


def write_run(trace: Trace, folder: Path) -> Path:
    """A trace as a LLaMA-Factory-like run folder plus a memory CSV."""
    s = trace.series
    out = folder / trace.name
    (out / "output").mkdir(parents=True, exist_ok=True)
    with open(out / "output" / "trainer_log.jsonl", "w") as f:
        f.writelines(
            json.dumps(
                {"current_steps": p.step, "total_steps": 150, "t": p.t}
                | ({"eval_loss": p.eval_loss} if p.eval_loss is not None else {"loss": p.loss})
                | ({"lr": p.lr} if p.lr is not None else {})
            )
            + "\n"
            for p in s.points
        )
    with open(out / "memory.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t", "gpu", "used_bytes", "total_bytes"])
        for gpu, xs in s.memory.items():
            for t, used, total in xs:
                w.writerow([f"{t:.3f}", gpu, used, total or ""])
    cfg = dict(s.config)
    if s.ds:
        (out / "ds_config.json").write_text(json.dumps(s.ds))
        cfg["deepspeed"] = str(out / "ds_config.json")
    (out / "train.yaml").write_text(yaml.safe_dump(cfg))
    (out / "output" / "train.log").write_text("".join(f"{line}\n" for _, line in s.logs))
    return out


if __name__ == "__main__":
    dest = Path(sys.argv[1] if len(sys.argv) > 1 else "corpus")
    for tr in corpus():
        print(write_run(tr, dest), sorted(tr.labels))
