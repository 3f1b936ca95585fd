"""The spike detector in the first seconds of sampling, where no baseline precedes a sample: a peak
is judged against the level the run holds after it, once enough samples show that level."""

from __future__ import annotations

from tunedeck.alerts import Series, analyze
from tunedeck.alerts.memory import AFTER, HISTORY

GiB = 1024**3
TOTAL = 192 * GiB
T0 = 1_800_000_000.0


def series(gib: list[float]) -> Series:
    # A little noise, as a real SMI reading never repeats exactly.
    mem = [(T0 + i, int(v * GiB) + (i % 3) * 2**20, TOTAL) for i, v in enumerate(gib)]
    return Series(memory={0: mem}, config={"cutoff_len": 2048}, devices=[0], running=True, now=T0 + len(gib))


def spikes(gib: list[float]) -> list:
    return [f for f in analyze(series(gib)) if f.kind in ("vram_spike", "vram_periodic_spikes")]


def test_a_loading_peak_in_the_first_samples_is_reported_against_the_level_after_it():
    run = [2, 40, 70, 40, 40, 41, 40, 40, 40, 41, 40, 40, 40, 40, 40, 41, 40, 40, 40, 40]
    (f,) = spikes(run)
    assert f.kind == "vram_spike" and f.gpu == 0 and f.times == [T0 + 2]
    assert "reached 70.0 GiB, +30.0 GiB above the 40.0 GiB baseline" in f.message, f.message
    assert f.suggestion.startswith("a peak while the job started"), f.suggestion


def test_an_early_peak_is_judged_once_the_level_after_it_shows_and_stays_one_occurrence():
    run = [2, 40, 70, 40, 40, 41, 40, 40, 40, 41, 40, 40, 40, 40, 40, 41, 40, 40, 40, 40]
    ready = 3 + AFTER  # the peak ends at sample 3; AFTER samples from there show the level
    assert spikes(run[: ready - 1]) == []
    for n in range(ready, len(run) + 1):  # every later evaluation finds the same single peak
        (f,) = spikes(run[:n])
        assert f.times == [T0 + 2], n


def test_what_is_not_an_early_spike():
    flat = [40] * 15
    assert spikes([0, 0, 10, 25, 40, *flat]) == []  # a warm-up climb stands above nothing that follows
    assert spikes([70, 40, 40, *flat]) == []  # high from the first sample: nothing shows it rose
    assert spikes([2, 40, 70, 70, 70, 70, *flat]) == []  # a rise that stays is a level change
    assert spikes([2, 40, 70, 70, 70, 70, 40, *flat]) == []  # four samples high: longer than a spike
    assert spikes([2, 40, 42, 40, *flat]) == []  # within the threshold (5 % of the level, 2 % of the GPU)


def test_spikes_on_either_side_of_the_first_judged_sample():
    run = [2, 40, 70, 40, 40, 40, 40, 40, 40, 40, 40, 40, 75, 40, 40, 40, 40, 40, 40, 40]
    (f,) = spikes(run)
    assert f.times == [T0 + 2, T0 + 12] and HISTORY < 12
    assert "2 transient VRAM spike(s); the largest reached 75.0 GiB" in f.message
