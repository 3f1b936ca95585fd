"""Spikes that recur every few samples (an optimizer step of 4 s sampled at 1 Hz): their edges make
up half the step-to-step differences or more, and must not pass for the sample noise that sets the
threshold (in a MAD of the differences they did, and raised it to half the spikes' height: the
pattern went unfound, or only a few of its spikes were told as one-off ones). Up to spikes that
stand up half the time: more, and the level they rise from is theirs (memory dips)."""

from __future__ import annotations

import numpy as np
import pytest

from tunedeck.alerts import Series, analyze

GiB = 1024**3
TOTAL = 80 * GiB
T0 = 1_900_000_000.0


def series(y: np.ndarray) -> Series:
    return Series(
        memory={0: [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]},
        points=[],
        config={"gradient_accumulation_steps": 1},
        running=False,
    )


@pytest.mark.parametrize(("every", "wide"), [(2, 1), (3, 1), (4, 1), (4, 2), (6, 3)])
@pytest.mark.parametrize("seed", range(2))
def test_spikes_every_few_samples_are_one_periodic_pattern(every, wide, seed):
    rng = np.random.default_rng(seed)
    n = 900
    y = np.full(n, 30.0 * GiB)
    y[:60] = np.linspace(2 * GiB, 30 * GiB, 60)  # warm-up
    y += rng.normal(0, 0.001 * TOTAL, n)
    at = np.arange(120, n - 10, every)
    for i in at:
        y[i : i + wide] += 8 * GiB
    found = [f for f in analyze(series(y)) if f.kind.startswith("vram_")]
    kinds = {f.kind for f in found}
    assert "vram_periodic_spikes" in kinds and "vram_spike" not in kinds, [f.message for f in found]
    (f,) = [f for f in found if f.kind == "vram_periodic_spikes"]
    assert f.count >= 0.9 * len(at), f.message


@pytest.mark.parametrize("seed", range(3))
def test_noise_well_over_the_threshold_floor_is_still_no_spike(seed):
    """Sampler noise with a sigma of 0.6 % of the card (6 sigma is 3.6 %, over the floor of 2 %: the
    noise sets the threshold). Few of its differences reach the 2 % that makes an edge, so counting
    those as no change leaves the noise estimate where it was (at 0.8 % a spike or two pass)."""
    rng = np.random.default_rng(seed)
    y = 30.0 * GiB + rng.normal(0, 0.006 * TOTAL, 3000)
    assert not [f for f in analyze(series(y)) if f.kind.startswith("vram_") and "spike" in f.kind]
