"""The stuck-loss detector judged by what must hold for any loss curve, not by the corpus beside it.

A loss is stuck when it stands flat (a spread under 0.5 % of its level) for 20 logged points in a row
at a level not below 90 % of the lowest of the run's first five losses, or frozen (a spread under
0.1 %) at a level not below 30 % of it. Mini-batch noise of 1 % or more (what any learning run shows)
is never flat; a run that converged sits far below where it began. Each curve is judged whole (an import) and fed in
random chunks (live), and the two must agree.
"""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.alerts.test_properties import RUNS as MEMORY_RUNS
from tests.alerts.test_streaming import chunked, key
from tunedeck.alerts import Point, Series, analyze, training

RUNS = settings(MEMORY_RUNS, max_examples=30)  # a loss curve has fewer dimensions than a memory trace

T0 = 1_800_000_000.0


def judged(losses: list[float], seed: int, *, running: bool = False, lr: float = 200.0) -> list:
    pts = [Point(t=T0 + 4 * k, step=k + 1, loss=float(v)) for k, v in enumerate(losses)]
    s = Series(points=pts, config={"learning_rate": lr}, running=running)
    whole = analyze(s)
    assert key(chunked(s, random.Random(seed)).findings(running=running)) == key(whole)
    return [f for f in whole if f.kind == "loss_stuck"]


@RUNS
@given(
    st.floats(0.5, 12.0),
    st.lists(st.floats(1.0, 1.1), max_size=10),
    st.integers(20, 120),
    st.floats(0, 0.002),
    st.booleans(),
    st.integers(0, 2**32 - 1),
    st.integers(0, 99),
)
def test_a_flat_line_at_or_above_its_start_is_stuck(level, before, flat, jitter, running, draw, seed):
    """Any first losses from the level up to 1.1 times it (a wrecked model may first log higher), then
    `flat` points within ±jitter of it: one finding, by the 20th flat point, open while live."""
    rng = np.random.default_rng(draw)
    losses = [level * x for x in before] + list(level * (1 + rng.uniform(-jitter, jitter, flat)))
    (f,) = judged(losses, seed, running=running)
    # Found by the 20th flat point at the latest (sooner where the first losses were level already),
    # and still stuck at the last one.
    assert T0 + 4 * 19 <= f.first <= T0 + 4 * (len(before) + 19) and f.t == T0 + 4 * (len(losses) - 1)
    assert f.count >= flat - 19 and f.open == running and f.step <= len(before) + 1
    assert f.severity == "warning" and "learning_rate is 200" in f.suggestion
    assert f.change == {"learning_rate": 1e-4}


@RUNS
@given(
    st.floats(0.5, 12.0),
    st.floats(0.3, 0.89),
    st.integers(20, 120),
    st.floats(0, 0.0004),
    st.integers(0, 2**32 - 1),
    st.integers(0, 99),
)
def test_a_line_frozen_after_it_came_down_is_stuck(start, share, flat, jitter, draw, seed):
    """Updates that stopped mid-run: the loss came down part of the way, then holds to the third digit."""
    rng = np.random.default_rng(draw)
    level = start * share
    descent = list(np.linspace(start, level, 12))[:-1]
    losses = descent + list(level * (1 + rng.uniform(-jitter, jitter, flat)))
    (f,) = judged(losses, seed)
    assert f.first <= T0 + 4 * (len(descent) + 19)
    bar = training.STUCK_HIGH * min(losses[: training.EARLY_LOSS])  # the flat band's: 90 % of the start
    if level < bar * (1 - 2 * training.STUCK_FROZEN):
        # Below the start's height: said as a line that stopped, and no key change claims to restart it.
        assert f.message.startswith("loss frozen at") and "after it came down from" in f.message, f.message
        assert f.change is None and "what stopped the updates" in f.suggestion
    elif level > bar * (1 + 2 * training.STUCK_FROZEN):
        assert f.message.startswith("loss stuck at") and "not below 90%" in f.message, f.message


@RUNS
@given(
    st.floats(0.5, 12.0),
    st.floats(0.3, 0.89),
    st.integers(20, 150),
    st.floats(0.0013, 0.004),
    st.integers(0, 2**32 - 1),
    st.integers(0, 99),
)
def test_a_plateau_after_it_came_down_is_not_stuck(start, share, tail, noise, draw, seed):
    """A loss that came down and levels off with the wobble of learning (the demo's is 0.13-0.2 %)."""
    rng = np.random.default_rng(draw)
    level = start * share
    descent = list(np.linspace(start, level, 12))[:-1]
    wobble = rng.uniform(-1, 1, tail)
    wobble[::7], wobble[3::7] = 1, -1  # the wobble reaches its whole width within every window
    losses = descent + list(level * (1 + noise / 2 * wobble))
    assert judged(losses, seed) == []


def test_the_demo_run_levelling_off_is_not_stuck():
    """The tail of a real 400-step demo run (the tiny model levels off at 81 % of its early losses)."""
    first = [6.1848, 6.1545, 6.09, 6.0204, 5.9339, 5.8934]
    tail = [4.8958, 4.8954, 4.8965, 4.8975, 4.9006, 4.8979, 4.8945, 4.8973, 4.8971, 4.8971, 4.8974, 4.8986]
    tail += [4.895, 4.9009, 4.8968, 4.8972, 4.8919, 4.8999, 4.8967, 4.8977, 4.8941, 4.8984, 4.8972, 4.8947]
    tail += [4.8972, 4.9005, 4.8967, 4.8919, 4.8966, 4.8985, 4.8944, 4.8975, 4.8996, 4.8954, 4.8947, 4.8953]
    descent = list(np.linspace(5.85, 4.9, 60))
    assert judged(first + descent + tail * 3, 0, lr=1e-4) == []


@RUNS
@given(
    st.floats(0.5, 12.0),
    st.floats(0.05, 0.7),
    st.floats(0.5, 60),
    st.integers(25, 300),
    st.floats(0.01, 0.1),
    st.integers(0, 2**32 - 1),
    st.integers(0, 99),
)
def test_a_loss_with_mini_batch_noise_is_never_stuck(start, end_share, tau, n, noise, draw, seed):
    """Any decaying curve, however quickly it converges, with the noise every learning run shows."""
    rng = np.random.default_rng(draw)
    k = np.arange(n)
    end = start * end_share
    losses = (end + (start - end) * np.exp(-k / tau)) * (1 + rng.normal(0, noise, n))
    assert judged(list(np.abs(losses)), seed) == []


@RUNS
@given(
    st.floats(0.5, 12.0),
    st.integers(5, 40),
    st.floats(0.01, 0.25),
    st.integers(20, 200),
    st.integers(0, 99),
)
def test_a_converged_flat_tail_near_zero_is_not_stuck(start, fall, share, tail, seed):
    """However flat, a tail at most 25 % of the lowest first loss has come down: it learned."""
    end = start * share
    descent = list(np.linspace(start, end, fall + 1))[:-1]
    lowest_first = min(descent[:5])
    end = min(end, 0.25 * lowest_first)
    assert judged([*descent, *[end] * tail], seed) == []


@RUNS
@given(st.floats(0.5, 12.0), st.integers(1, 19), st.integers(20, 100), st.integers(0, 99))
def test_a_flat_warm_up_shorter_than_the_window_is_not_stuck(level, flat, rest, seed):
    """A loss that holds still for fewer than 20 points (a learning-rate warm-up), then learns."""
    rng = np.random.default_rng(seed)
    k = np.arange(rest)
    learning = level * (0.4 + 0.6 * np.exp(-k / 10)) * (1 + rng.normal(0, 0.02, rest))
    assert judged([level] * flat + list(learning), seed) == []


def test_the_lr200_run_is_stuck_and_says_what_to_change():
    """The run that sat at 6.1225 for 37 steps (the demo model at learning_rate 200)."""
    (f,) = judged([9.1, 7.4] + [6.1225] * 37, 0, running=True)
    assert "loss stuck at 6.1225 for 37 logged points (steps 3 to 39)" in f.message
    assert f.suggestion.startswith("learning_rate is 200, far above")
    assert f.open and f.step == 3
    sane = judged([2.3] * 30, 0, lr=5e-5)[0]
    assert (
        "lower learning_rate from 5e-5 to 5e-6" in sane.suggestion
        and "labels not all masked" in sane.suggestion
    )
    assert sane.change == {"learning_rate": 5e-6}
