"""What the corpus tests leave loose and mutants of the detectors showed (bench/mutation.py): each
check here fails on a mutant that every corpus test let through."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from tests.alerts import realistic
from tunedeck.alerts import Point, Series, analyze
from tunedeck.alerts.memory import BLOCKS, HISTORY, LEVEL, NOISE, SMOOTH, WINDOW, levels, periodic
from tunedeck.alerts.rundir import BadInput, parse_config, parse_memory_csv, parse_trainer_log
from tunedeck.alerts.series import gib, median
from tunedeck.alerts.training import swings

GiB = 1024**3
T0 = 1_900_000_000.0


def reference(full: np.ndarray, p: int) -> tuple[float, float, float, float]:
    """levels() for sample p, one sample at a time from its definition."""
    before = full[:p]
    base = float(np.median(before[-LEVEL:])) if p else math.nan
    spread = float(np.ptp(before[-LEVEL:])) if p else math.inf
    d = np.diff(full)[max(0, p - 1 - WINDOW) : max(0, p - 1)]
    noise = float(np.median(np.abs(d - np.median(d)))) * NOISE if len(d) else 0.0
    pad = np.concatenate([np.repeat(full[0], SMOOTH - 1), full])
    smooth = float(np.median(pad[p : p + SMOOTH]))
    return base, spread, noise, smooth


@pytest.mark.parametrize("h", [0, HISTORY, WINDOW + 1])
def test_levels_match_their_definition_at_every_sample(h):
    rng = np.random.default_rng(h)
    full = np.cumsum(rng.normal(0, 1, 3 * WINDOW)) + 50
    got = levels(full, h)  # full[:h]: the samples before, already judged
    for p in range(h, len(full)):
        want = reference(full, p)
        for name, a, b in zip(("base", "spread", "noise", "smooth"), (x[p - h] for x in got), want):
            assert a == pytest.approx(b, rel=1e-9, abs=1e-9, nan_ok=True), (name, p)


def test_memory_csv_bounds():
    ok = parse_memory_csv("t,gpu,used_bytes,total_bytes\n1.0,0,1000,2000\n2.0,0,1500,\n")
    assert ok == {0: [(1.0, 1000, 2000), (2.0, 1500, None)]}
    for row in ("1,0,-1,2000", "1,0,1000,-5", f"1,0,1000,{2**62}", f"1,0,{2**62},1", "nan,0,1,1", "1,-2,1,1"):
        with pytest.raises(BadInput):
            parse_memory_csv("t,gpu,used_bytes,total_bytes\n" + row + "\n")


def test_a_finished_divergence_is_closed_and_a_live_one_open():
    tr = realistic.simulate(realistic.TUNE[0], "divergence")
    (f,) = [f for f in analyze(tr.series) if f.kind == "loss_divergence"]
    assert not f.open
    tr.series.running = True
    (f,) = [f for f in analyze(tr.series) if f.kind == "loss_divergence"]
    assert f.open


def test_divergence_at_half_the_smoothed_values_rising():
    # Raw losses chosen so that the 10-point mean runs 2.0, 1.9 (the minimum), then 2.0, 1.95, 3.0,
    # 2.9: two rises in four, the last two over the bar of 1.5 × 1.9.
    raw = [2.0] * 10 + [1.0, 3.0, 1.5, 12.5, 1.0]
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(raw)])
    assert "loss_divergence" in {f.kind for f in analyze(s)}
    s.points[-3].loss = 1.5 - 10 * 0.1  # 1.85 instead of 1.95: a new minimum, nothing after it rose
    assert "loss_divergence" not in {f.kind for f in analyze(s)}


def test_a_wide_rise_from_a_climbing_level_is_no_spike_of_its_own():
    # 40 GiB, then a rise to 60 GiB that keeps climbing to 64 (no settled level), a further +20 GiB
    # for 6 samples on top of it (back to 62), then down to 40 GiB within half a minute: one spike.
    y = [40.0] * 40 + list(np.linspace(60, 64, 10)) + [84.0] * 6 + [62.0] * 3 + [40.0] * 40
    mem = {0: [(T0 + i, int(v * GiB), 192 * GiB) for i, v in enumerate(y)]}
    (f,) = [f for f in analyze(Series(memory=mem, devices=[0])) if f.kind == "vram_spike"]
    assert f.count == 1 and f.times == [T0 + 40]


def test_trainer_log_times_follow_the_first_memory_sample():
    text = (
        '{"current_steps": 1, "loss": 2.0, "elapsed_time": "0:00:05"}\n'
        '{"current_steps": 2, "loss": 1.9}\n'
        '{"current_steps": 2, "eval_loss": 1.8, "elapsed_time": "0:01:10"}\n'
    )
    points, _ = parse_trainer_log(text, 100.0)
    assert [p.t for p in points] == [105.0, 105.0, 170.0]
    assert [p.step for p in points] == [1, 2, 2] and points[2].eval_loss == 1.8


def test_sizes_in_messages_switch_to_gib_at_a_tenth():
    assert gib(GiB / 10) == "0.1 GiB" and gib(GiB / 10 - 1024**2) == "101 MiB" and gib(3 * GiB) == "3.0 GiB"


def test_trainer_log_step_bounds():
    assert parse_trainer_log('{"current_steps": 1000000000000000, "loss": 1.0}\n', 0.0)[0][0].step == 10**15
    for step in (2**62, -1):
        with pytest.raises(BadInput):
            parse_trainer_log(f'{{"current_steps": {step}, "loss": 1.0}}\n', 0.0)


def test_a_loss_at_zero_has_no_level_to_swing_around():
    y = [0.0, 0.0, 0.0, 1.0] * 20  # the median is 0: the swing has no size against it
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(y)])
    assert "loss_oscillation" not in {f.kind for f in analyze(s)}


def test_a_stall_among_the_first_steps_is_dated_one_bar_after_the_last_step():
    # Too few intervals yet to settle a usual step: judged on what there is (median 1 s, bar 120 s).
    ts = [0.0, 1.0, 2.0, 502.0, 503.0]
    s = Series(points=[Point(t=T0 + t, step=k + 1, loss=1.0) for k, t in enumerate(ts)])
    (f,) = [f for f in analyze(s) if f.kind == "stall"]
    assert f.times == [T0 + 2.0 + 120.0] and f.step == 3


def test_train_yaml_must_be_a_mapping():
    assert parse_config("learning_rate: 0.1\n") == {"learning_rate": 0.1}
    with pytest.raises(BadInput):
        parse_config("- learning_rate\n")


@pytest.mark.parametrize("after", [1.0, 37.0])
def test_a_wide_rise_that_falls_below_where_it_rose_from_is_no_spike(after):
    # 40 GiB, +20 GiB for 10 samples, then down to `after`: below the level by more than half the
    # floor (3.84 GiB on 192 GiB), so memory was freed (the end of a run), not a spike that came back.
    y = [40.0] * 40 + [60.0] * 10 + [after] * 30
    mem = {0: [(T0 + i, int(v * GiB), 192 * GiB) for i, v in enumerate(y)]}
    assert "vram_spike" not in {f.kind for f in analyze(Series(memory=mem, devices=[0]))}
    y[50:] = [40.0] * 30  # back to its level: a spike
    mem = {0: [(T0 + i, int(v * GiB), 192 * GiB) for i, v in enumerate(y)]}
    assert "vram_spike" in {f.kind for f in analyze(Series(memory=mem, devices=[0]))}


def test_allocator_flushes_stay_open_only_while_they_keep_coming():
    line = "[rank0]: {} pytorch allocator cache flushes since last step. this happens when ..."
    logs = [(T0 + k, line.format(n)) for k, n in enumerate((3, 5, 2))]
    s = Series(logs=logs, devices=[0], now=T0 + 10)
    (f,) = [f for f in analyze(s) if f.kind == "alloc_flush"]
    assert not f.open and f.count == 3 and "up to 5 per step" in f.message  # the run has ended
    s.running = True
    (f,) = [f for f in analyze(s) if f.kind == "alloc_flush"]
    assert f.open
    s.now = T0 + 2 + 300  # the 300 s hold, to the second
    assert [f.open for f in analyze(s) if f.kind == "alloc_flush"] == [True]
    s.now = T0 + 2 + 301  # no flush for longer than the hold
    (f,) = [f for f in analyze(s) if f.kind == "alloc_flush"]
    assert not f.open


def test_a_stuck_loss_is_told_against_ninety_percent_of_its_start():
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=2.0) for k in range(30)])
    (f,) = [f for f in analyze(s) if f.kind == "loss_stuck"]
    assert "not below 90% of where the run began (2)" in f.message


def test_a_divergence_from_a_loss_of_zero_is_told_without_a_ratio():
    y = [0.0] * 10 + [0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(y)])
    (f,) = [f for f in analyze(s) if f.kind == "loss_divergence"]
    assert f.message == "loss diverging: 5.5 from 0"  # no "×" against a minimum of 0


def test_an_oom_is_placed_on_the_gpu_its_first_message_names():
    logs = [
        (T0 + 1, "torch.OutOfMemoryError: CUDA out of memory. GPU 1 has a total capacity of 79.3 GiB"),
        (T0 + 2, "torch.OutOfMemoryError: CUDA out of memory. GPU 0 has a total capacity of 79.3 GiB"),
    ]
    (f,) = [f for f in analyze(Series(logs=logs, devices=[4, 5])) if f.kind == "oom"]
    assert f.gpu == 5 and f.count == 2  # the job's local GPU 1 is the node's GPU 5


@pytest.mark.parametrize(
    ("losses", "first", "still"),
    [([2.0, 1.9, math.nan, 1.8], 3, False), ([2.0, 1.9, 1.8, math.nan], 4, True)],
)
def test_a_nan_loss_stays_open_only_while_the_loss_is_still_nan(losses, first, still):
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(losses)], running=True)
    (f,) = [f for f in analyze(s) if f.kind == "loss_nan"]
    assert f.open is still and f.step == first


@pytest.mark.parametrize(("config", "said"), [({"bf16": True}, "(bf16: false)"), ({}, "(fp16/bf16 false)")])
def test_a_nan_without_fp16_asks_for_the_precision_it_runs_in_off(config, said):
    """A bf16 run is not told to turn fp16 off: what a run without AMP would show is asked of its own."""
    losses = [2.0, 1.9, math.nan, 1.8]
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(losses)], config=config)
    (f,) = [f for f in analyze(s) if f.kind == "loss_nan"]
    assert f"run once with AMP off {said}" in f.suggestion and "fp16: false)" not in f.suggestion


def test_a_plateau_is_told_with_its_own_span():
    # A climb to 40 GiB, then 40 GiB ± 50 MiB of noise: the flat stretch after warm-up.
    rng = np.random.default_rng(5)
    y = np.concatenate([np.linspace(5, 40, 30), 40 + rng.uniform(-0.05, 0.05, 570)])
    mem = {0: [(T0 + i, int(v * GiB), 192 * GiB) for i, v in enumerate(y)]}
    (f,) = [f for f in analyze(Series(memory=mem, devices=[0])) if f.kind == "vram_plateau"]
    start, end = f.times
    m = re.search(r"stayed within [\d.]+ [GM]iB for (\d+) s", f.message)
    assert m and int(m[1]) == round(end - start) and end == T0 + len(y) - 1, f.message


def test_divergence_needs_half_the_smoothed_values_since_the_minimum_rising():
    # As in the test above (two rises in four), then a fifth value that stays over the bar without
    # rising (the mean drops from 2.9 to 2.86): two rises in five is not a divergence.
    raw = [2.0] * 10 + [1.0, 3.0, 1.5, 12.5, 1.0, 1.6]
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(raw)])
    assert "loss_divergence" not in {f.kind for f in analyze(s)}


def test_a_divergence_from_a_negative_loss_is_told_without_a_ratio():
    y = [-1.0] * 10 + [0.5, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(y)])
    (f,) = [f for f in analyze(s) if f.kind == "loss_divergence"]
    assert "×" not in f.message and f.message.endswith("from -1"), f.message


def test_a_stall_after_the_usual_steps_settled_is_dated_one_bar_after_the_last_step():
    ts = [float(k) for k in range(21)] + [521.0, 522.0, 523.0]  # 1 s steps, then 500 s without one
    s = Series(points=[Point(t=T0 + t, step=k + 1, loss=1.0 + 0.01 * (k % 3)) for k, t in enumerate(ts)])
    (f,) = [f for f in analyze(s) if f.kind == "stall"]
    assert f.times == [T0 + 20.0 + 120.0] and f.step == 21
    assert f.message.startswith("no step progress for 501 s after step 21"), f.message


def memory(y, total: float | None = 192 * GiB, points=()) -> Series:
    """A run sampled once a second, `y` in GiB."""
    mem = {0: [(T0 + i, int(v * GiB), int(total) if total else None) for i, v in enumerate(y)]}
    return Series(memory=mem, devices=[0], points=list(points))


def only(findings, kind):
    (f,) = [f for f in findings if f.kind == kind]
    return f


def test_a_loading_peak_is_judged_against_the_level_right_after_it():
    # A peak to 30 GiB at the second sample, 10 GiB for the AFTER samples that follow it, then the run
    # climbs to 40 GiB: the peak stood +20 GiB over the level it fell back to, not over a later one.
    y = [10.0, 30.0] + [10.0] * 5 + [40.0] * 200
    f = only(analyze(memory(y)), "vram_spike")
    assert f.times == [T0 + 1] and f"+{gib(20 * GiB)} above the {gib(10 * GiB)} baseline" in f.message, (
        f.message
    )


def test_a_rise_under_64_mib_is_no_spike_even_on_a_small_level():
    # 0.5 GiB with no capacity known: 5 % of the level is 26 MiB, under the 64 MiB floor.
    def spikes(mib):
        y = [0.5] * 100 + [0.5 + mib / 1024] + [0.5] * 100
        return [f for f in analyze(memory(y, total=None)) if f.kind == "vram_spike"]

    assert spikes(40) == []
    assert len(spikes(80)) == 1


def test_the_largest_spike_told_is_the_largest_outside_eval_phases():
    # Spikes of +10 GiB and +20 GiB while training, +30 GiB during the eval phase from step 290 to T0 + 305.
    y = [40.0] * 400
    y[100], y[200], y[300] = 50.0, 60.0, 70.0
    points = [Point(t=T0 + k, step=k, loss=1.0) for k in range(1, 291)]
    points.append(Point(t=T0 + 305, step=290, eval_loss=1.0))
    points += [Point(t=T0 + 5 + k, step=k, loss=1.0) for k in range(291, 395)]
    f = only(analyze(memory(y, points=points)), "vram_spike")
    assert f.count == 2 and f.times == [T0 + 100, T0 + 200]
    assert f"the largest reached {gib(60 * GiB)}, +{gib(20 * GiB)} above" in f.message, f.message


def test_a_periodic_spike_finding_is_placed_at_the_step_of_the_newest_spike():
    y = [40.0] * 300
    for t in (100, 150, 200, 250):
        y[t] = 50.0
    points = [Point(t=T0 + k, step=k, loss=1.0) for k in range(1, 300)]
    f = only(analyze(memory(y, points=points)), "vram_periodic_spikes")
    assert f.times[-1] == T0 + 250 and f.step == 250


@pytest.mark.parametrize("c", [520, 521, 522])
def test_a_long_plateau_starts_within_one_summary_block_of_where_memory_settled(c):
    # 1000 samples: the plateau's summary holds blocks of two samples after the first 512. The start is
    # late by the smoothing (SMOOTH // 2 samples) and at most one block (the run's length / BLOCKS).
    y = [20.0] * c + [40.0] * (1000 - c)
    f = only(analyze(memory(y)), "vram_plateau")
    assert 0 <= f.times[0] - (T0 + c + SMOOTH // 2) <= len(y) / BLOCKS, f.times


def test_a_plateau_covers_half_the_run_after_warm_up_not_half_the_whole_run():
    # 400 samples: warm-up is the first tenth (40 s), so the flat stretch must last 180 s of the 359 after.
    def plateau(c):  # memory settles at 40 GiB from sample c (4 samples later, smoothed)
        y = [20.0] * c + [40.0] * (400 - c)
        return [f for f in analyze(memory(y)) if f.kind == "vram_plateau"]

    (f,) = plateau(205)  # 190 s
    assert f"settled at {gib(40 * GiB)} (21% of {gib(192 * GiB)})" in f.message, f.message
    assert f.suggestion.startswith(f"{gib(152 * GiB)} headroom"), f.suggestion
    assert plateau(225) == []  # 170 s


def test_a_long_plateau_covers_half_the_run_after_warm_up_too():
    # 1000 samples, summarised in blocks of two: warm-up ends at 100 s, so the stretch must last 450 s.
    def plateau(c):
        y = [20.0] * c + [40.0] * (1000 - c)
        return [f for f in analyze(memory(y)) if f.kind == "vram_plateau"]

    assert len(plateau(540)) == 1  # 455 s
    assert plateau(560) == []  # 435 s


def test_a_plateau_past_the_summary_s_first_coarsening_tells_its_level():
    # 600 samples: the first 512 were merged into blocks of two, which hold most of the run.
    f = only(analyze(memory([40.0] * 600)), "vram_plateau")
    assert f"settled at {gib(40 * GiB)}" in f.message, f.message


def test_memory_that_moves_less_than_32_mib_is_flat_however_small_its_level():
    # 0.5 GiB (3 % of it is 15 MiB), no capacity known, a step of 20 MiB at 3/4 of the run.
    y = [0.5] * 300 + [0.5 + 20 / 1024] * 100
    f = only(analyze(memory(y, total=None)), "vram_plateau")
    assert f.times == [T0 + 40, T0 + 399] and f"within {gib(20 * 1024**2)} for" in f.message, f.message


@pytest.mark.parametrize("before", [20.0, 60.0])
def test_a_plateau_tells_the_spread_of_its_own_stretch(before):
    # A level change to exactly 40 GiB: the stretch after it has no spread, whatever came before.
    y = [before] * 150 + [40.0] * 250
    f = only(analyze(memory(y)), "vram_plateau")
    assert f.times[0] > T0 + 150 and f"stayed within {gib(0)} for" in f.message, f.message


def test_a_divergence_from_the_first_points_is_measured_from_the_mean_of_the_first_four():
    y = [1.0, 1.0, 1.0, 2.0] + [float(k) for k in range(3, 16)]
    points = [Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(y)]
    f = only(analyze(Series(points=points, config={"learning_rate": 1e-3})), "loss_divergence")
    assert "smoothed 10.5 against a minimum of 1.25 at step 4 (×8.4)" in f.message, f.message  # 10.5 / 1.25
    assert f.change == {"learning_rate": 2.5e-4}  # a quarter of it
    # With no learning rate to lower, the change is a warm-up over the first tenth.
    assert only(analyze(Series(points=points)), "loss_divergence").change == {"warmup_ratio": 0.1}


@pytest.mark.parametrize("rise", [[20.0, 12.5, 30.0], [20.0, 30.0]])
def test_an_early_excursion_peaks_at_its_highest_sample_before_it_came_back_down(rise):
    # From 10 GiB up to 20, maybe 12.5 (over half the 3.84 GiB floor above the level: still up), 30, back.
    y = [10.0, *rise] + [10.0] * 200
    f = only(analyze(memory(y)), "vram_spike")
    assert f.times == [T0 + 1] and f"the largest reached {gib(30 * GiB)}" in f.message, f.message


def test_a_peak_at_the_fifth_sample_is_a_spike():
    y = [10.0] * 4 + [30.0] + [10.0] * 200
    assert only(analyze(memory(y)), "vram_spike").times == [T0 + 4]


def test_swings_need_a_whole_window_and_a_longest_swing_beyond_it():
    y = np.array([2.0, 2.5, 2.0, 1.5] * 6)
    assert swings(y[:23]) is None
    assert swings(y) == (pytest.approx(0.5 / math.sqrt(2) / 2), 2.0, 4)


@pytest.mark.parametrize("size", [17.45, 17.55])
def test_an_oscillation_message_tells_the_swing_against_the_level(size):
    # 2, 2 + a, 2, 2 - a, ...: the running median stays at 2, the residual's standard size is a / √2.
    a = size / 100 * 2 * math.sqrt(2)
    y = [2.0, 2.0 + a, 2.0, 2.0 - a] * 15
    f = only(
        analyze(Series(points=[Point(t=T0 + k, step=k + 1, loss=v) for k, v in enumerate(y)])),
        "loss_oscillation",
    )
    assert f"swings of ±{size:.0f}% around 2, up and down about every 4 logged points" in f.message, f.message


def test_noise_of_any_size_is_no_oscillation():
    rng = np.random.default_rng(11)
    for spread in (0.5, 1.0, 5.0):
        y = 10.0 + rng.uniform(-spread, spread, 60)
        s = Series(points=[Point(t=T0 + k, step=k + 1, loss=float(v)) for k, v in enumerate(y)])
        assert "loss_oscillation" not in {f.kind for f in analyze(s)}, spread


def test_a_stall_is_open_only_while_the_run_lives_without_progress():
    ts = [float(k) for k in range(21)] + [521.0, 522.0, 523.0]  # 1 s steps, 500 s without one, then more
    s = Series(
        points=[Point(t=T0 + t, step=k + 1, loss=1.0 + 0.01 * (k % 3)) for k, t in enumerate(ts)],
        running=True,
        now=T0 + 523,
    )
    assert not only(analyze(s), "stall").open  # the steps came back
    s.now = T0 + 523 + 200
    assert only(analyze(s), "stall").open


def test_a_gap_among_the_first_steps_is_judged_against_the_usual_step_once_known():
    # 1 s, 1 s, then 150 s: over the 120 s bar of the first two, but steps then take 20 s (bar 200 s).
    ts = [0.0, 1.0, 2.0, 152.0] + [152.0 + 20 * k for k in range(1, 12)]
    s = Series(points=[Point(t=T0 + t, step=k + 1, loss=1.0 + 0.01 * (k % 3)) for k, t in enumerate(ts)])
    assert "stall" not in {f.kind for f in analyze(s)}


def test_a_stuck_loss_counts_each_point_it_stood_stuck_at_once():
    s = Series(points=[Point(t=T0 + k, step=k + 1, loss=2.0) for k in range(30)])
    assert only(analyze(s), "loss_stuck").count == 30 - 20 + 1  # from the 20th point on


def test_a_near_oom_is_open_only_while_a_live_run_stays_near_capacity():
    y = [40.0] * 100 + [190.0] * 10  # the last 10 samples over 95 % of 192 GiB
    assert not only(analyze(memory(y)), "vram_near_oom").open  # the run has ended
    s = memory(y)
    s.running = True
    assert only(analyze(s), "vram_near_oom").open


def test_spikes_are_periodic_when_three_gaps_in_four_are_regular():
    # Gaps of 10 s with one stray in four (3 in 4 regular): periodic; two strays in four are not.
    assert periodic([0.0, 10.0, 20.0, 30.0, 55.0]) == pytest.approx(10.0)
    assert periodic([0.0, 10.0, 20.0, 45.0, 70.0]) is None
    assert periodic([0.0, 10.0, 20.0]) is None  # fewer than 4 spikes


def test_the_docs_state_the_stuck_and_stall_rules_the_code_holds():
    from pathlib import Path

    from tunedeck.alerts import training

    text = " ".join((Path(__file__).parents[2] / "docs" / "telemetry.md").read_text().split())
    assert (
        f"no less than {100 * training.STUCK_HIGH:.0f} % of the lowest of its first {training.EARLY_LOSS}"
        in text
    )
    assert f"frozen (spread under {100 * training.STUCK_FROZEN:.1f} %)" in text
    assert f"above {100 * training.STUCK_FLOOR:.0f} % of that start" in text
    assert f"allowed {training.SAVE_BARS} bars more" in text


@pytest.mark.parametrize("seed", range(4))
def test_median_is_numpys_to_the_bit(seed):
    """The findings' own median (a sort, not np.median's machinery) gives np.median's float for every
    length, odd and even, ints, float32, repeated values, infinities and NaN, and for deques."""
    from collections import deque

    rng = np.random.default_rng(seed)
    for n in range(1, 40):
        for x in (
            rng.normal(0, 1e9, n),
            rng.integers(-5, 5, n),
            rng.normal(0, 1, n).astype(np.float32),
            np.round(rng.normal(0, 3, n)),
            np.where(rng.random(n) < 0.2, np.inf, rng.normal(0, 1, n)),
        ):
            want = float(np.median(x))
            assert median(x) == want or (math.isnan(want) and math.isnan(median(x))), (n, x)
            assert median(deque(x.tolist())) == float(np.median(deque(x.tolist())))
        with_nan = rng.normal(0, 1, n)
        with_nan[rng.integers(n)] = np.nan
        assert math.isnan(median(with_nan))
    assert math.isnan(median([]))
