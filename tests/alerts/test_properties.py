"""The memory detectors judged by what must hold for any trace, not by a corpus written beside them.

Traces are 1 Hz samples on a 192 GiB GPU: an optional warm-up climb, then a level L between 20 and
120 GiB, all with bounded noise of amplitude a ≤ 0.4 GiB (≤ 1 GiB for the healthy traces). The floor promised for a spike at that level is
max(5 % of L, 2 % of the GPU) (six times the noise's σ stays below it): 3.84 GiB up to L = 77 GiB,
5 % of L above. An excursion counts as big when it rises at least X = 1.25 × that floor: the margin
covers the noise on either side of the rise (2a ≤ 0.8 GiB against 0.25 × 3.84 GiB). Each trace is
judged twice: whole (an import) and fed in random chunks (live), and the two must agree.
"""

from __future__ import annotations

import random
import re

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.alerts.test_streaming import chunked, key
from tunedeck.alerts import Series, analyze

GiB = 1024**3
TOTAL = 192 * GiB
T0 = 1_800_000_000.0
MEMORY_KINDS = ("vram_spike", "vram_periodic_spikes", "vram_near_oom")
MINUTE = 60  # samples: the widest excursion that must still count as one spike
RUNS = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def floor(level: float) -> float:
    return max(0.05 * level, 0.02 * TOTAL)


def big(level: float) -> float:
    return 1.25 * floor(level)


@st.composite
def base_trace(draw, n: int, max_amp: float = 0.4) -> tuple[np.ndarray, float, float]:
    """(samples in bytes, level, noise amplitude): a noisy warm-up climb, then a noisy flat line."""
    level = draw(st.floats(20, 120)) * GiB
    amp = draw(st.floats(0, max_amp)) * GiB
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    y = level + rng.uniform(-amp, amp, n)
    warm = draw(st.sampled_from([0, 10, 30]))
    y[:warm] += np.linspace(2 * GiB, level, warm) - level
    return y, level, amp


def series(y: np.ndarray) -> Series:
    mem = [(T0 + i, int(v), TOTAL) for i, v in enumerate(y)]
    return Series(memory={0: mem}, config={"cutoff_len": 2048}, devices=[0], running=False)


def judged(y: np.ndarray, seed: int) -> list:
    """The findings on the whole trace, checked equal to the trace fed in random chunks."""
    s = series(y)
    whole = analyze(s)
    assert key(chunked(s, random.Random(seed)).findings(running=False)) == key(whole)
    return whole


def memory_alerts(findings) -> list:
    return [f for f in findings if f.kind in MEMORY_KINDS]


@st.composite
def excursion(draw):
    start = draw(st.integers(40, 100))
    width = draw(st.integers(1, MINUTE))
    y, level, _amp = draw(base_trace(start + width + draw(st.integers(15, 60))))
    return y, level, start, width


@RUNS
@given(excursion(), st.floats(1.0, 4.0), st.integers(0, 99))
def test_a_big_excursion_of_any_width_raises_exactly_one_alert_at_its_start(trace, times_x, seed):
    y, level, start, width = trace
    y = y.copy()
    y[start : start + width] += times_x * big(level)
    (f,) = memory_alerts(judged(y, seed))
    assert f.kind == "vram_spike" and f.times == [T0 + start] and f.count == 1


@RUNS
@given(excursion(), st.floats(0, 40), st.floats(0, 40), st.integers(0, 99))
def test_bigger_never_hides_what_smaller_showed(trace, a, b, seed):
    y, _level, start, width = trace
    small, large = sorted((a * GiB, b * GiB))

    def shown(size: float) -> tuple[set[str], bool]:
        z = y.copy()
        z[start : start + width] += size
        found = memory_alerts(judged(z, seed))
        inside = any(T0 + start <= t <= T0 + start + width for f in found for t in f.times)
        return {f.kind for f in found}, inside

    kinds_small, seen_small = shown(small)
    kinds_large, seen_large = shown(large)
    assert kinds_small <= kinds_large and (seen_large or not seen_small)


@RUNS
@given(
    st.integers(120, 400).flatmap(lambda n: base_trace(n, max_amp=1.0)),
    st.lists(st.tuples(st.floats(0, 1), st.integers(1, 60), st.floats(0, 1)), max_size=8),
    st.integers(0, 99),
)
def test_a_healthy_trace_with_noise_and_bumps_below_the_floor_raises_nothing(trace, bumps, seed):
    y, level, amp = trace
    y = y.copy()
    room = 0.8 * floor(level) - 2 * amp  # a bump this high plus the noise stays under the floor
    up = np.zeros(len(y))
    for at, width, height in bumps:  # where bumps overlap, the higher one
        i = 40 + int(at * (len(y) - 41))
        up[i : i + width] = np.maximum(up[i : i + width], height * room)
    y += up
    assert memory_alerts(judged(y, seed)) == []


@st.composite
def periodic_trace(draw, jitter: float):
    period = draw(st.integers(8, 40))
    lo, hi = int(np.ceil((1 - jitter) * period)), int(np.floor((1 + jitter) * period))
    gaps = draw(st.lists(st.integers(lo, hi), min_size=11, max_size=24))
    width = draw(st.integers(1, max(1, min(3, period // 4))))
    starts = list(40 + np.cumsum([0, *gaps]))
    y, level, _amp = draw(base_trace(starts[-1] + 20))
    return y, level, [int(s) for s in starts], width


@RUNS
@given(st.floats(0, 0.2).flatmap(periodic_trace), st.floats(1.0, 3.0), st.integers(0, 99))
def test_periodic_spikes_are_reported_with_their_period_for_any_jitter_up_to_20_percent(trace, times_x, seed):
    y, level, starts, width = trace
    y = y.copy()
    for s in starts:
        y[s : s + width] += times_x * big(level)
    (f,) = memory_alerts(judged(y, seed))
    assert f.kind == "vram_periodic_spikes" and f.times == [T0 + s for s in starts]
    reported = float(re.search(r"every ([0-9.]+) s", f.message).group(1))
    actual = (starts[-1] - starts[0]) / (len(starts) - 1)
    assert abs(reported - actual) <= 0.1 * actual, (reported, actual)


@RUNS
@given(st.integers(6, 20), st.floats(2.0, 3.0), st.integers(5, 12), st.integers(0, 99), st.data())
def test_spikes_at_alternating_intervals_are_not_periodic(short, ratio, pairs, seed, data):
    """Gaps that alternate between g and 2g or more: no period describes them."""
    gaps = [short, round(ratio * short)] * pairs
    starts = [int(s) for s in 40 + np.cumsum([0, *gaps])]
    y, level, _amp = data.draw(base_trace(starts[-1] + 20))
    y = y.copy()
    for s in starts:
        y[s] += 2 * big(level)
    (f,) = memory_alerts(judged(y, seed))
    assert f.kind == "vram_spike" and f.times == [T0 + s for s in starts]


def test_the_worst_mix_of_20_percent_jitter_is_still_periodic():
    """Gaps at both ends of ±20 %, in the proportion that strays furthest from their mean."""
    for gaps in ([24] * 3 + [16] * 7, [16] * 7 + [24] * 3, [24, 16, 16] * 4, [16] * 9 + [24] * 3):
        starts = [int(s) for s in 40 + np.cumsum([0, *gaps])]
        y = np.full(starts[-1] + 20, 60.0 * GiB)
        y[starts] += 2 * big(60 * GiB)
        (f,) = memory_alerts(judged(y, 0))
        reported = float(re.search(r"every ([0-9.]+) s", f.message).group(1))
        assert f.kind == "vram_periodic_spikes" and abs(reported - np.mean(gaps)) <= 0.1 * np.mean(gaps), gaps


@RUNS
@given(st.integers(60, 120).flatmap(base_trace), st.integers(1, 8), st.integers(0, 99))
def test_near_oom_needs_three_samples_in_a_row_over_95_percent(trace, width, seed):
    y, _level, _amp = trace
    y = y.copy()
    y[50 : 50 + width] = 0.96 * TOTAL + np.linspace(0, 0.02 * TOTAL, width)
    near = [f for f in memory_alerts(judged(y, seed)) if f.kind == "vram_near_oom"]
    if width < 3:
        assert near == []
    else:
        (f,) = near
        assert f.times == [T0 + i for i in range(52, 50 + width)] and f"for {width} samples" in f.message


def test_the_width_gap_the_sweep_found():
    """+30 GiB on a 50 GiB line: 4 samples wide used to raise nothing, 5 to 7 were reported at their
    tail, 8 or more raised nothing. Every width up to a minute is one spike at its start; a rise that
    lasts longer, or never comes back, is a level change (the plateau and near-OOM judge levels)."""
    rng = np.random.default_rng(7)
    for width in [*range(1, 13), 30, 59, 60, 61, 90, 200, 300]:  # 300: up to the end of the trace
        y = 50 * GiB + rng.normal(0, 0.05 * GiB, 400)
        y[100 : 100 + width] += 30 * GiB
        spikes = [f for f in judged(y, width) if f.kind in ("vram_spike", "vram_periodic_spikes")]
        if width <= MINUTE:
            (f,) = spikes
            assert f.times == [T0 + 100] and re.search(
                r"\+(29\.9|30\.\d) GiB above the (49\.9|50\.\d) GiB", f.message
            )
            assert ("the longest lasted" in f.message) == (width > 3)
        else:
            assert spikes == [], width


def test_a_rise_that_ends_in_memory_freed_is_not_a_spike():
    """The end of a run: memory rises for a final evaluation, then the process frees it all. It came
    down, but not to the level it rose from."""
    y = np.full(300, 50.0 * GiB)
    y[200:220] += 30 * GiB
    y[220:] = 1 * GiB
    assert [f.kind for f in judged(y, 0) if f.kind in ("vram_spike", "vram_periodic_spikes")] == []
    y[220:] = 50 * GiB  # back to where it rose from: a spike
    (f,) = [f for f in judged(y, 0) if f.kind == "vram_spike"]
    assert f.times == [T0 + 200] and "the longest lasted 20 s" in f.message


def test_a_climb_that_overshoots_into_a_noisy_line_is_not_a_spike():
    """The warm-up climb's last sample stands above the line that follows and the line's noise dips a
    few samples later (a trace the corpus generator drew): a climb has no settled level to rise from."""
    climb = [
        1.68,
        4.38,
        6.31,
        9.34,
        10.57,
        13.43,
        14.98,
        16.81,
        18.87,
        21.17,
        23.97,
        25.04,
        27.72,
        30.03,
        32.39,
        34.58,
        36.85,
        39.85,
        39.62,
        42.45,
        45.69,
        48.06,
        48.83,
        51.15,
        53.84,
        55.7,
        58.6,
        59.65,
        62.58,
        65.41,
    ]
    line = [
        64.1,
        64.14,
        64.56,
        64.93,
        62.68,
        63.53,
        64.39,
        64.83,
        64.76,
        64.57,
        64.89,
        65.17,
        64.36,
        63.84,
        65.01,
        64.72,
        65.26,
        64.54,
        64.61,
        64.64,
        64.68,
        65.13,
        64.24,
        64.69,
        65.23,
        64.82,
        64.8,
        64.89,
        64.0,
        64.79,
    ] * 4
    assert memory_alerts(judged(np.array(climb + line) * GiB, 0)) == []
