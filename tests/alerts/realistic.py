"""A labelled corpus of simulated LLaMA-Factory runs, written without looking at the detectors.

Each run is built the way a fine-tune behaves: weights load in shards, the allocator warms up over
the first steps, then memory holds a level per GPU with sampler noise; trainer_log points arrive every
`logging_steps` optimizer steps with the loss averaged over them; eval phases every `eval_steps` hold
extra memory for as long as they last and end with an `eval_loss` point; fp16 runs skip steps on
loss-scale overflow. Faults are injected on top, and the labels say what was injected: they come
from the construction, never from running the detectors.

What counts as a fault is fixed here from what matters to a person watching a run, not from the
detectors' constants:
- a memory spike takes at least 8 % of the card above the level, for 1 sample to under a minute
  (the span issue 15 asks a spike to be found over; longer is a level change); healthy
  allocator jitter stays within 1 % of the card, so nothing lies between the two;
- near-OOM: the card held 96.5 % full or more for at least half a minute; healthy runs stay
  below 88 % (eval phases included);
- oscillation: the logged loss swings with a period of 2 to 12 points and an amplitude of at least
  12 % of its level after the logging average; healthy loss noise is at most 6 % per logged point,
  and a swing that the logging average leaves between 6 and 12 % is not scored either way;
- divergence: after its minimum the loss climbs to at least 2.5 times it and stays up;
- stuck: the loss freezes (no change beyond 0.05 %) at up to 1.3 times where it was, for the rest
  of the run; or the learning rate is about 0 all along (a scheduler that gives at most 1e-4 of
  learning_rate, learning_rate 0 or a typo far under the usual range, a warm-up 200-1000 times longer
  than the run), so the loss only moves as far as that rate takes it (the curve's progress is the sum
  of the rates, against 1e-4);
- overfitting: the eval loss turns up while the train loss keeps falling: a run of several epochs over
  a small set, evaluated every eval_steps (10-40 evals in the run) on a fixed eval set, whose loss
  therefore moves little from one eval to the next (0.2-1 % noise). From a turn 25-60 % of the way
  through, the eval loss climbs by 4-50 % of where it turned by the last eval, while the train loss
  still falls (it reaches its floor only after the end). It is labelled when the eval loss stands
  10 % or more above its lowest at 3 evals or more (a rise a person would act on); a smaller rise is
  not scored either way;
- one GPU drifting: from 30-60 % of the way through training one GPU's memory moves away from its
  peers', which hold, by 7 % of the card or more (a climb that reaches 8-12 % at the end, or a step
  up or down of 7-20 % that stays; one that rises may be read as a leak on that rank too: not
  scored); healthy ranks differ by a steady offset of up to ±5 % of the card and wander by at most
  0.5 %, so nothing lies between the two. The leak scenario's one leaking GPU of several drifts too.

Every run logs the learning rate its schedule gives (LLaMA-Factory's default cosine after a linear
warm-up), as trainer_log.jsonl does.

The split is by seed: seeds 0-99 are for tuning, 100-199 are held out (`HELD_OUT`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tunedeck.alerts import Point, Series

GiB = 1024**3
T0 = 1_900_000_000.0
TUNE = range(0, 100)
HELD_OUT = range(100, 200)
CARDS = (24, 48, 80, 141, 192)  # GiB: consumer, A6000/L40, A100/H100, H200, MI300X
SCENARIOS = (
    "healthy",
    "healthy_eval_heavy",
    "healthy_fp16_overflow",
    "spike",
    "periodic_spikes",
    "near_oom",
    "leak",
    "nan",
    "divergence",
    "oscillation_fp16",
    "stuck",
    "hang",
    "resumed",
    "save_gather",
    # Appended (each scenario's draws come from its own stream: the ones above stay as they were).
    "lr_zero",
    "gpu_drift",
    "healthy_cosine",
    "healthy_uneven_gpus",
    "overfit",
)
WATCHDOG_S = 1800.0  # a collective's default timeout: a hung rank is killed after it
Z3_GATHER = {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}


@dataclass
class Sim:
    """The drawn knobs of one run."""

    seed: int
    scenario: str
    gpus: int
    total: float
    precision: str
    logging_steps: int
    eval_steps: int | None
    eval_s: float
    eval_rise: float  # share of the card an eval phase holds on top of the level
    step_s: float
    sample_s: float
    warmup_steps: int
    ga: int
    steps: int
    level: float  # share of the card held while training
    mem_noise: float  # share of the card, sampler noise sigma
    loss_noise: float  # relative, per optimizer step
    save_steps: int = 0  # save_gather: a checkpoint every this many steps (0: none configured)
    # The schedule: learning_rate, its warm-up in steps, the scheduler's own factor (lr_zero: a
    # scheduler that gives about 0), the train.yaml keys that say so, and the uneven ranks' offsets.
    lr: float = 1e-4
    lr_warmup: int | None = None  # None: warmup_steps
    lr_factor: float = 1.0
    lr_keys: dict = field(default_factory=dict)
    offsets: tuple[float, ...] = ()  # share of the card each GPU holds above or below the level


@dataclass
class Trace:
    name: str
    series: Series
    labels: set[str]
    sim: Sim
    notes: list[str] = field(default_factory=list)
    unsure: set[str] = field(default_factory=set)  # kinds neither labelled nor ruled out: not scored


def _draw(rng: np.random.Generator, seed: int, scenario: str) -> Sim:
    gpus = int(rng.choice([1, 1, 2, 4, 8]))
    precision = (
        "fp16"
        if scenario in ("healthy_fp16_overflow", "oscillation_fp16")
        else str(rng.choice(["bf16", "fp16"]))
    )
    logging_steps = int(rng.choice([1, 5, 10, 50]))
    # A periodic pattern needs a step that spans a few samples; others may step faster than the sampler.
    step_s = float(rng.uniform(4, 9)) if scenario == "periodic_spikes" else float(rng.uniform(0.5, 8))
    sample_s = float(rng.choice([0.5, 1.0, 1.0, 2.0]))
    if scenario == "periodic_spikes":
        sample_s = min(sample_s, step_s / 4)
    # Enough logged points to judge the loss (>= 60) and a run of 10-40 minutes of samples.
    duration = float(rng.uniform(600, 1500))
    steps = max(int(duration / step_s), 60 * logging_steps)
    steps = min(steps, 3000)
    eval_steps = None
    if scenario == "healthy_eval_heavy" or rng.random() < 0.6:
        eval_steps = int(rng.choice([2, 4, 8])) * max(logging_steps, 10)
        eval_steps = min(eval_steps, max(steps // 3, 1))
    sim = Sim(
        seed=seed,
        scenario=scenario,
        gpus=gpus,
        total=float(rng.choice(CARDS)) * GiB,
        precision=precision,
        logging_steps=logging_steps,
        eval_steps=eval_steps,
        eval_s=float(rng.uniform(5, 150)),
        eval_rise=float(rng.uniform(0.03, 0.2))
        if scenario == "healthy_eval_heavy"
        else float(rng.uniform(0.01, 0.12)),
        step_s=step_s,
        sample_s=sample_s,
        warmup_steps=int(rng.choice([0, 10, 50, 100])),
        ga=int(rng.choice([1, 2, 4, 8])),
        steps=steps,
        # Spikes need room under the card for what they add.
        level=float(rng.uniform(0.25, 0.55 if scenario in ("spike", "periodic_spikes") else 0.7)),
        mem_noise=float(rng.choice([0.0, 0.0003, 0.001, 0.002])),
        loss_noise=float(rng.choice([0.005, 0.02, 0.04, 0.06])),
    )
    # Drawn after the rest, so that the older scenarios' draws stay as they were.
    if scenario in ("save_gather", "resumed"):
        sim.save_steps = max(1, sim.steps // int(rng.integers(3, 8)) // logging_steps) * logging_steps
    if scenario == "lr_zero":
        # Mini-batch noise beyond the 0.5 % flat band, as the runs had it.
        sim.loss_noise = float(rng.choice([0.02, 0.04, 0.06]))
        how = str(rng.choice(["scheduler", "zero", "typo", "warmup"]))
        if how == "scheduler":
            sim.lr_factor = float(rng.choice([0.0, float(rng.uniform(0, 1e-4))]))
            sim.lr_keys = {
                "lr_scheduler_type": str(rng.choice(["polynomial", "cosine_with_min_lr", "inverse_sqrt"]))
            }
        elif how == "zero":
            sim.lr = 0.0
        elif how == "typo":
            sim.lr = float(rng.uniform(1e-9, 5e-8))
        else:
            sim.lr_warmup = int(sim.steps * float(rng.uniform(200, 1000)))
            sim.lr_keys = {"warmup_steps": sim.lr_warmup}
    elif scenario == "healthy_cosine":
        # warmup_ratio 0.1 and a cosine to 0: the loss levels off while the rate decays.
        sim.lr_warmup = sim.steps // 10
        sim.lr_keys = {"warmup_steps": 0, "warmup_ratio": 0.1}
    if scenario == "overfit":
        sim.eval_steps = max(1, sim.steps // int(rng.integers(10, 41)))
    if scenario in ("gpu_drift", "healthy_uneven_gpus"):
        sim.gpus = int(rng.choice([2, 4, 8]))
        sim.level = min(sim.level, 0.6)
        sim.offsets = tuple(float(x) for x in rng.uniform(-0.05, 0.05, sim.gpus))
    return sim


# ---------------------------------------------------------------------------------------- the clock


def _timeline(
    sim: Sim, rng: np.random.Generator, saves: list[tuple[float, float]] | None = None
) -> tuple[float, np.ndarray, list[tuple[float, float]]]:
    """(time training starts, end time of each optimizer step, eval phases as (start, end)).
    Steps take step_s with 10 % jitter; an eval phase follows its step and delays the next one, and
    so does a checkpoint save (save_gather: 10-90 s each, appended to `saves`)."""
    load_s = float(rng.uniform(15, 90))
    t = T0 + load_s
    ends, evals = np.empty(sim.steps), []
    for k in range(1, sim.steps + 1):
        t += sim.step_s * float(rng.uniform(0.9, 1.1))
        ends[k - 1] = t
        if sim.eval_steps and k % sim.eval_steps == 0 and k < sim.steps:
            e = sim.eval_s * float(rng.uniform(0.9, 1.1))
            evals.append((t, t + e))
            t += e
        if saves is not None and k % sim.save_steps == 0 and k < sim.steps:
            d = float(rng.uniform(10, 90))
            saves.append((t, t + d))
            t += d
    return T0 + load_s, ends, evals


# --------------------------------------------------------------------------------------- the loss


def _loss_curve(sim: Sim, rng: np.random.Generator, rates: np.ndarray | None = None) -> np.ndarray:
    """The loss of every optimizer step: flat through warm-up, then an exponential fall to a floor.
    With `rates` (the learning rate of each step), the fall follows their sum against 1e-4 instead."""
    k = np.arange(1, sim.steps + 1, dtype=np.float64)
    start, floor = float(rng.uniform(1.5, 3.5)), float(rng.uniform(0.3, 1.2))
    tau = float(rng.uniform(0.1, 0.4)) * sim.steps
    past = np.maximum(0.0, k - sim.warmup_steps) if rates is None else np.cumsum(rates) / 1e-4
    clean = floor + (start - floor) * np.exp(-past / tau)
    return clean * (1 + rng.normal(0, sim.loss_noise, sim.steps))


def _schedule(sim: Sim, lr0: float, warmup: int) -> np.ndarray:
    """The learning rate at every optimizer step: a linear warm-up over `warmup` steps, then a cosine
    decay to 0 at the last step (LLaMA-Factory's lr_scheduler_type: cosine)."""
    k = np.arange(1, sim.steps + 1, dtype=np.float64)
    up = np.minimum(1.0, k / warmup) if warmup else np.ones(sim.steps)
    rest = np.clip((k - warmup) / max(1, sim.steps - warmup), 0, 1)
    return lr0 * up * 0.5 * (1 + np.cos(np.pi * rest))


def _logged(sim: Sim, per_step: np.ndarray, ends: np.ndarray) -> list[tuple[int, float, float]]:
    """(step, time, loss) as trainer_log.jsonl has them: every logging_steps, the mean since the last."""
    out, L = [], sim.logging_steps
    for k in range(L, sim.steps + 1, L):
        out.append((k, float(ends[k - 1]) + 0.01, float(np.mean(per_step[k - L : k]))))
    return out


# ------------------------------------------------------------------------------------- the memory


def _memory(sim: Sim, rng: np.random.Generator, start: float, end: float, evals, gpu: int) -> tuple:
    """(times, used bytes) of one GPU: shard loading, warm-up climb, the level, eval phases held up."""
    t = np.arange(T0, end + 5 * sim.sample_s, sim.sample_s)
    total = sim.total
    level = sim.level * total * (1 + (0.02 if gpu == 0 else 0.0))  # rank 0 keeps a little more
    weights = level * float(rng.uniform(0.3, 0.6))
    y = np.empty(len(t))
    # Loading: shards arrive in 3-8 steps up to the weights.
    shards = int(rng.integers(3, 9))
    frac = np.clip((t - T0) / max(start - T0, 1e-9), 0, 1)
    y[:] = 0.5 * GiB + np.floor(frac * shards) / shards * (weights - 0.5 * GiB)
    # Warm-up: the allocator caches activations over the first minute of training.
    climb = float(rng.uniform(10, 60))
    train = t >= start
    y[train] = weights + (level - weights) * np.minimum(1.0, (t[train] - start) / climb)
    rise = min(sim.eval_rise, 0.86 - sim.level * 1.02) * total
    for a, b in evals:
        y[(t >= a) & (t < b)] += rise
    y[t > end] = 0.5 * GiB  # the process exits and frees the card
    y += rng.normal(0, sim.mem_noise * total, len(t))
    return t, np.clip(y, 0, total)


# ------------------------------------------------------------------------------------- the faults


def _inject(sim: Sim, rng, tr_loss: np.ndarray, mem: dict, start: float, end: float, evals) -> tuple:
    """Apply the scenario's fault; returns (labels, unsure, notes, log lines)."""
    labels: set[str] = set()
    unsure: set[str] = set()
    notes: list[str] = []
    logs: list[tuple[float, str]] = []
    s, total = sim.scenario, sim.total
    train_t = mem[0][0][(mem[0][0] >= start + 90) & (mem[0][0] <= end - 60)]

    def quiet(t0: float, width: float, margin: float = 30.0) -> bool:
        return all(
            not (a - margin <= t0 <= b + margin or a - margin <= t0 + width <= b + margin) for a, b in evals
        )

    if s == "spike":
        gpu = int(rng.integers(0, sim.gpus))
        for _ in range(int(rng.integers(1, 4))):
            w = int(rng.integers(1, max(2, int(55 / sim.sample_s)) + 1))  # 1 sample to under a minute
            spots = [t0 for t0 in rng.choice(train_t, 50) if quiet(float(t0), w * sim.sample_s)]
            if not spots:  # eval phases everywhere: a spike would be theirs
                continue
            t0 = float(spots[0])
            t, y = mem[gpu]
            i = int(np.searchsorted(t, t0))
            room = 0.88 * total - y[i : i + w].max()
            size = min(float(rng.uniform(0.08, 0.4)) * total, room)
            if size < 0.08 * total:
                continue
            y[i : i + w] += size
            labels.add("vram_spike")
            notes.append(f"GPU {gpu}: +{size / GiB:.1f} GiB for {w} samples at {t0 - T0:.0f} s")
    elif s == "periodic_spikes":
        size = float(rng.uniform(0.08, 0.25)) * total
        added = 0
        jitter = float(rng.uniform(0, 0.15))
        period = sim.step_s * float(rng.choice([1, 2]))
        w = int(rng.integers(1, 3))
        for gpu in range(sim.gpus):
            t, y = mem[gpu]
            y_flat = y.copy()
            at = start + 90.0
            while at < end - 60:
                i = int(np.searchsorted(t, at))
                # Training pauses for an eval phase: so do the optimizer steps' spikes.
                if (
                    quiet(at, w * sim.sample_s, 2 * sim.sample_s)
                    and y_flat[i : i + w].max() + size < 0.88 * total
                ):
                    y[i : i + w] += size
                    added += 1
                at += period * float(rng.uniform(1 - jitter, 1 + jitter))
        if added >= 4 * sim.gpus:
            labels.add("vram_periodic_spikes")
        notes.append(f"+{size / GiB:.1f} GiB every {period:.1f} s (jitter {100 * jitter:.0f} %)")
    elif s == "near_oom":
        share = float(rng.uniform(0.965, 0.99))
        for gpu in range(sim.gpus):
            t, y = mem[gpu]
            on = (t >= start + 60) & (t <= end)
            y[on] = share * total + rng.normal(0, 0.001 * total, int(on.sum()))
            y[:] = np.minimum(y, total)
        labels.add("vram_near_oom")
        notes.append(f"held at {100 * share:.1f} % of the card")
    elif s == "leak":
        gpu = int(rng.integers(0, sim.gpus))
        t, y = mem[gpu]
        on = t >= start + 60
        rate = (0.985 * total - y[on][0]) / max(float(t[on][-1] - t[on][0]) * 0.8, 1.0)
        y[on] = np.minimum(y[on] + rate * (t[on] - t[on][0]), 0.985 * total)
        hold = t[on][y[on] >= 0.985 * total - 1]
        if len(hold):
            logs.append(
                (float(hold[-1]), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB")
            )
            labels |= {"vram_leak", "oom"}
            if sim.gpus > 1:  # one GPU climbing while its peers hold
                labels.add("gpu_drift")
            if float(hold[-1] - hold[0]) >= 30:
                labels.add("vram_near_oom")
        notes.append(f"GPU {gpu}: leaks {rate * 60 / GiB:.2f} GiB/min")
    elif s == "nan":
        k = int(rng.integers(sim.steps // 5, sim.steps * 4 // 5))
        tr_loss[k:] = math.nan if rng.random() < 0.8 else math.inf
        labels.add("loss_nan")
        notes.append(f"loss NaN/inf from step {k + 1}")
    elif s == "divergence":
        k = int(rng.integers(sim.steps // 4, sim.steps // 2))
        lo = float(np.mean(tr_loss[max(0, k - 20) : k]))
        factor = float(rng.uniform(2.5, 8))
        ramp = np.linspace(0, 1, sim.steps - k) ** float(rng.uniform(0.5, 2))
        tr_loss[k:] = lo * (1 + (factor - 1) * ramp) * (1 + rng.normal(0, sim.loss_noise, sim.steps - k))
        labels.add("loss_divergence")
        notes.append(f"loss climbs ×{factor:.1f} from step {k}")
    elif s == "oscillation_fp16":
        L = sim.logging_steps
        period_pts = int(rng.integers(2, 13))
        amp = float(rng.uniform(0.2, 0.6))
        P = period_pts * L
        k0 = int(rng.integers(0, sim.steps // 3))
        phase = float(rng.uniform(0, 2 * math.pi))
        swing = np.zeros(sim.steps)
        swing[k0:] = amp * np.sin(2 * math.pi * np.arange(sim.steps - k0) / P + phase)
        tr_loss *= 1 + swing
        # The swing is in steps; what the log shows is its mean over each L steps (how much of it is
        # left depends on the period and on where the logging windows fall on it).
        shown = swing[: sim.steps // L * L].reshape(-1, L).mean(axis=1)[k0 // L + 1 :]
        logged = float(shown.max() - shown.min()) / 2 if len(shown) else 0.0
        if logged >= 0.12:
            labels.add("loss_oscillation")
        elif logged >= 0.06:  # between healthy noise and a swing worth a warning
            unsure.add("loss_oscillation")
        notes.append(f"loss swings ±{100 * amp:.0f} % every {P} steps (±{100 * logged:.0f} % logged)")
    elif s == "gpu_drift":
        gpu = int(rng.integers(0, sim.gpus))
        shape = str(rng.choice(["climb", "up", "down"]))
        t, y = mem[gpu]
        on = (t >= start) & (t <= end)
        t0 = start + float(rng.uniform(0.3, 0.6)) * (end - start)
        share = float(rng.uniform(0.08, 0.12)) if shape == "climb" else float(rng.uniform(0.07, 0.2))
        room = 0.88 * total - float(y[on].max())
        if shape != "down" and room < share * total:
            shape = "down" if room < 0.07 * total else shape
            share = min(share, room / total) if shape != "down" else share
        ramp_s = end - t0 if shape == "climb" else float(rng.uniform(30, 120))
        move = np.clip((t - t0) / ramp_s, 0, 1) * share * total * (-1 if shape == "down" else 1)
        y[on] += move[on]
        labels.add("gpu_drift")
        if shape != "down":  # one rank's memory rising and staying up: fairly read as a leak on it too
            unsure.add("vram_leak")
        notes.append(f"GPU {gpu}: {shape} by {100 * share:.0f} % of the card from {t0 - T0:.0f} s")
    elif s == "stuck":
        k = int(rng.integers(sim.steps // 5, sim.steps // 2))
        tr_loss[k:] = float(tr_loss[k] * rng.uniform(1.0, 1.3)) * (1 + rng.normal(0, 0.0002, sim.steps - k))
        labels.add("loss_stuck")
        notes.append(f"loss frozen from step {k}")
    return labels, unsure, notes, logs


def _overfit(sim: Sim, rng, eval_k: list[int]) -> tuple[np.ndarray, list[float], set[str], set[str], str]:
    """overfit: the train loss of every step (still falling at the end), the eval loss at each eval
    step of `eval_k`, and the labels, kinds not scored and a note."""
    k = np.arange(1, sim.steps + 1, dtype=np.float64)
    start, floor = float(rng.uniform(1.5, 3.5)), float(rng.uniform(0.1, 0.6))
    tau = float(rng.uniform(0.35, 0.7)) * sim.steps  # slow enough to be falling still at the end
    clean = floor + (start - floor) * np.exp(-np.maximum(0.0, k - sim.warmup_steps) / tau)
    tr_loss = clean * (1 + rng.normal(0, sim.loss_noise, sim.steps))
    turn = int(sim.steps * float(rng.uniform(0.25, 0.6)))
    gap = float(rng.uniform(1.02, 1.15))  # the eval loss stands over the train loss before the turn
    rise = float(rng.uniform(0.04, 0.5))  # by the last eval, against the eval loss at the turn
    bend = float(rng.uniform(1.0, 2.0))
    e = np.asarray(eval_k, dtype=np.int64)
    ev_clean = gap * clean[np.minimum(e, turn) - 1]
    ev_clean *= 1 + rise * np.clip((e - turn) / max(1, e.max() - turn), 0, 1) ** bend
    noise = float(rng.uniform(0.002, 0.01))
    ev = ev_clean * (1 + rng.normal(0, noise, len(e)))
    lo = int(np.argmin(ev_clean))
    over = (ev_clean >= 1.1 * ev_clean[lo]) & (np.arange(len(e)) > lo)  # after its lowest
    labels: set[str] = set()
    unsure: set[str] = set()
    if int(over.sum()) >= 3:
        labels.add("loss_overfit")
    elif rise >= 0.03:
        unsure.add("loss_overfit")
    note = (
        f"eval loss turns up at step {turn}, +{100 * rise:.0f} % by the end (eval noise {100 * noise:.1f} %)"
    )
    return tr_loss, [float(x) for x in ev], labels, unsure, note


def _overflow_logs(sim: Sim, rng, ends: np.ndarray) -> list[tuple[float, str]]:
    """fp16: the loss scale halves on the first steps, then an overflow now and then."""
    out, scale = [], 65536
    for k in range(min(int(rng.integers(3, 12)), sim.steps)):
        out.append(
            (
                float(ends[k]),
                f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}, reducing to "
                f"{scale // 2}",
            )
        )
        scale //= 2
    for k in rng.choice(sim.steps, size=min(sim.steps // 200 + 1, sim.steps), replace=False):
        out.append(
            (float(ends[k]), f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {scale}")
        )
    return sorted(out)


def simulate(seed: int, scenario: str) -> Trace:
    rng = np.random.default_rng([seed, SCENARIOS.index(scenario)])
    sim = _draw(rng, seed, scenario)
    saves: list[tuple[float, float]] = []
    start, ends, evals = _timeline(sim, rng, saves if scenario == "save_gather" else None)
    end = float(ends[-1]) + 2.0
    last = sim.steps  # the last step any process logs
    replay: tuple[int, int, float, float, float] | None = (
        None  # resumed: died, checkpoint, shift, down, reload
    )
    eval_k = [int(np.searchsorted(ends, a - 1e-6)) + 1 for a, _ in evals]  # the step each phase follows
    if scenario == "hang":
        # A rank hangs in a collective after step `last`; the others wait until the watchdog kills all.
        last = int(rng.integers(sim.steps // 3, 2 * sim.steps // 3))
        evals = [e for e in evals if e[1] <= ends[last - 1]]
        end = float(ends[last - 1]) + WATCHDOG_S
    elif scenario == "resumed":
        # The job dies after step `died`; minutes later a new process loads and resumes from the newest
        # checkpoint at or before it (a save every save_steps), appending to the same log.
        died = int(rng.integers(sim.steps // 3, 2 * sim.steps // 3))
        ckpt = died // sim.save_steps * sim.save_steps
        down, reload = float(rng.uniform(60, 600)), float(rng.uniform(15, 90))
        shift = float(ends[died - 1] - (ends[ckpt - 1] if ckpt else start)) + down + reload
        replay = (died, ckpt, shift, down, reload)
        kept = [(e, k) for e, k in zip(evals, eval_k) if k <= died] + [
            ((a + shift, b + shift), k) for (a, b), k in zip(evals, eval_k) if k > ckpt
        ]
        evals, eval_k = [e for e, _ in kept], [k for _, k in kept]
        end = float(ends[-1]) + shift + 2.0
    warmup = sim.warmup_steps if sim.lr_warmup is None else sim.lr_warmup
    rates = _schedule(sim, sim.lr, warmup) * sim.lr_factor
    new = scenario in ("lr_zero", "healthy_cosine")  # the older scenarios' curves stay as they were
    tr_loss = _loss_curve(sim, rng, rates if new else None)
    ev_loss: list[float] | None = None
    if scenario == "overfit":
        tr_loss, ev_loss, ov_labels, ov_unsure, ov_note = _overfit(sim, rng, eval_k)
    mem = {g: list(_memory(sim, rng, start, end, evals, g)) for g in range(sim.gpus)}
    for g, off in enumerate(sim.offsets):  # uneven ranks: a steady offset, a slow wander within 1 %
        t, y = mem[g]
        on = (t >= start) & (t <= end)
        wander = np.cumsum(rng.normal(0, 1, len(t)))
        wander = 0.005 * sim.total * wander / max(1e-9, float(np.abs(wander).max()))
        # Reached with the warm-up climb (the offset is the rank's activations and caches).
        y[on] += (off * sim.total + wander[on]) * np.minimum(1.0, (t[on] - start) / 60)
        mem[g][1] = np.clip(y, 0, sim.total)
    labels, unsure, notes, logs = _inject(sim, rng, tr_loss, mem, start, end, evals)
    if sim.precision == "fp16":
        logs += [x for x in _overflow_logs(sim, rng, ends) if x[0] <= ends[last - 1]]
    logged = [x for x in _logged(sim, tr_loss, ends) if x[0] <= last]
    if scenario == "hang":
        labels.add("stall")
        notes.append(f"steps stop after step {last}; the watchdog ends the job {WATCHDOG_S:.0f} s later")
    elif replay is not None:
        died, ckpt, shift, down, reload = replay
        t_died = float(ends[died - 1])
        logged = [x for x in logged if x[0] <= died] + [(k, t + shift, v) for k, t, v in logged if k > ckpt]
        for g in range(sim.gpus):  # the card is free while no process runs, then the weights load again
            t, y = mem[g]
            y[(t > t_died + 2) & (t <= t_died + down)] = 0.5 * GiB
            y[(t > t_died + down) & (t <= t_died + down + reload)] = 0.4 * sim.level * sim.total
        notes.append(f"dies after {died}, resumed from checkpoint-{ckpt} {down:.0f} s later")
        if not [k for k, _, _ in logged if ckpt < k <= died]:
            # Nothing logged after the checkpoint before it died: the log shows no step going back, only
            # a long gap (the card freed meanwhile says the process was gone; the log cannot).
            unsure.add("stall")
    if saves:  # ZeRO-3 gathers the 16-bit weights onto every GPU for each save
        gather = min(float(rng.uniform(0.04, 0.12)), 0.86 - sim.level * 1.02) * sim.total
        for g in range(sim.gpus):
            t, y = mem[g]
            for a, b in saves:
                y[(t >= a) & (t < b)] += gather
        if rng.random() < 0.5:  # the Trainer's own line, when its INFO log is kept
            logs += [
                (a, f"Saving model checkpoint to saves/run/checkpoint-{i + 1}")
                for i, (a, _) in enumerate(saves)
            ]
        notes.append(f"{len(saves)} saves gather +{gather / GiB:.1f} GiB")
    if ev_loss is not None:
        labels |= ov_labels
        unsure |= ov_unsure
        notes.append(ov_note)
    if scenario == "lr_zero":
        labels.add("loss_stuck")
        notes.append(f"learning rate peaks at {float(rates.max()):.2g} against learning_rate {sim.lr:g}")
    points = [Point(t=t, step=k, loss=v, lr=float(rates[k - 1])) for k, t, v in logged]
    for i, ((a, b), k) in enumerate(zip(evals, eval_k)):
        v = ev_loss[i] if ev_loss is not None else float(tr_loss[k - 1] * 1.05)
        points.append(Point(t=b + 0.01, step=k, eval_loss=v))
    points.sort(key=lambda p: (p.t, p.eval_loss is not None))
    memory = {g: [(float(a), int(b), int(sim.total)) for a, b in zip(*mem[g])] for g in range(sim.gpus)}
    config = {
        "stage": "sft",
        "finetuning_type": "lora",
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": sim.ga,
        "learning_rate": sim.lr,
        "lr_scheduler_type": "cosine",
        "logging_steps": sim.logging_steps,
        "warmup_steps": sim.warmup_steps,
        **sim.lr_keys,
        "cutoff_len": 2048,
        "fp16": sim.precision == "fp16",
        "bf16": sim.precision == "bf16",
        **({"eval_strategy": "steps", "eval_steps": sim.eval_steps} if sim.eval_steps else {}),
        **({"save_steps": sim.save_steps} if sim.save_steps else {}),
    }
    series = Series(
        memory=memory,
        points=points,
        logs=sorted(logs),
        config=config,
        ds=Z3_GATHER if scenario == "save_gather" else None,
        devices=list(range(sim.gpus)),
        running=False,
    )
    return Trace(f"{scenario}-{seed}", series, labels, sim, notes, unsure)


def generate(seed: int) -> list[Trace]:
    return [simulate(seed, s) for s in SCENARIOS]
