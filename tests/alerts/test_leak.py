"""A memory trend: memory that climbs steadily after warm-up is a leak, told with its rate and the
time left until the card is full; noise, eval bumps and a level change once are not."""

from __future__ import annotations

import re

import numpy as np
import pytest

from tunedeck.alerts import Series, analyze

GiB = 1024**3
T0 = 1_900_000_000.0
CARD = 80 * GiB


def trace(y: np.ndarray) -> Series:
    return Series(memory={0: [(T0 + i, int(v), CARD) for i, v in enumerate(y)]}, devices=[0])


def leaks(y: np.ndarray) -> list:
    return [f for f in analyze(trace(y)) if f.kind == "vram_leak"]


def base(rng: np.random.Generator, n: int, level: float, noise: float) -> np.ndarray:
    """Loading for 60 s, a warm-up climb, then `level` GiB with noise (1 Hz)."""
    y = level * GiB + rng.normal(0, noise * GiB, n)
    y[:60] = 5 * GiB
    y[60:90] = np.linspace(5, level, 30) * GiB
    return y


@pytest.mark.parametrize("seed", range(4))
def test_a_steady_climb_is_a_leak_with_the_time_left(seed):
    rng = np.random.default_rng(seed)
    level, rate = float(rng.uniform(15, 35)), float(rng.uniform(0.5, 2.0))  # GiB, GiB a minute
    n = 1800
    y = base(rng, n, level, float(rng.uniform(0, 0.2)))
    y[120:] += rate * GiB * np.arange(n - 120) / 60
    y = np.minimum(y, 0.99 * CARD)
    still = y[-1] < 0.98 * CARD
    (f,) = leaks(y)
    got = float(re.search(r"\(([\d.]+) GiB/min\)", f.message)[1])
    assert abs(got - rate) <= 0.2 * rate, (got, rate, f.message)
    if still:  # still climbing at the end: how long until the card is full at that rate
        left = (CARD - y[-30:].mean()) / (rate * GiB / 60) / 60
        m = re.search(r"fills the card in about (\d+) min", f.message)
        assert m and abs(int(m[1]) - left) <= max(2, 0.25 * left), (m, left, f.message)


@pytest.mark.parametrize("seed", range(4))
def test_noise_eval_bumps_and_one_level_change_are_no_leak(seed):
    rng = np.random.default_rng(100 + seed)
    n = 1800
    y = base(rng, n, 30, 0.3)
    for a in range(300, n, 300):  # eval phases: +12 GiB for 60 s every 5 minutes
        y[a : a + 60] += 12 * GiB
    assert not leaks(y)
    y = base(rng, n, 30, 0.3)
    y[int(rng.integers(400, 1400)) :] += 16 * GiB  # longer sequences arrive: the level moves up once
    assert not leaks(y)
