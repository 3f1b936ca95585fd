"""Stalls judged in optimizer steps, whatever the logging cadence: the bar is ten usual steps (two
minutes at least) beyond the steps a gap between two logged points holds, more where a checkpoint
save or an evaluation falls inside it; a log that a resumed run appended to starts a new process."""

from __future__ import annotations

import numpy as np

from tunedeck.alerts import Point, Series, analyze
from tunedeck.alerts.rundir import build

GiB = 1024**3
T0 = 1_900_000_000.0


def stalls(s: Series) -> list:
    return [f for f in analyze(s) if f.kind == "stall"]


def steps_run(
    *, steps: int, every: int, step_s: float, pauses: dict[int, float] | None = None, seed: int = 0
) -> list[Point]:
    """A point every `every` optimizer steps of about `step_s` (±5 %); `pauses`: seconds spent after
    a step (a save)."""
    rng = np.random.default_rng(seed)
    t, out = T0 + 60, []
    for k in range(1, steps + 1):
        t += step_s * float(rng.uniform(0.95, 1.05))
        if k % every == 0:
            out.append(Point(t=t, step=k, loss=2.0 - k / (2 * steps)))
        t += (pauses or {}).get(k, 0.0)
    return out


def sampled(until: float) -> dict:
    """A flat 30 GiB of an 80 GiB card every 5 s from T0: the process lived until `until`."""
    return {0: [(float(t), 30 * GiB, 80 * GiB) for t in np.arange(T0, until, 5.0)]}


def test_a_hang_is_flagged_in_steps_however_sparse_the_logging():
    # logging_steps 50 at 8 s a step: a point every ~400 s. The steps stop after step 950; the process
    # lives on for the 30 minutes a collective's watchdog waits. The old bar, 10 logged gaps, was
    # ~67 minutes: never reached.
    cfg = {"logging_steps": 50}
    points = steps_run(steps=950, every=50, step_s=8.0)
    last = points[-1].t
    s = Series(memory=sampled(last + 1800), points=points, config=cfg, devices=[0])
    (f,) = stalls(s)
    # Due: 49 more steps without a point (~392 s), then the 120 s bar.
    assert last + 450 <= f.times[0] <= last + 600 and f.step == 950
    assert "the log has a point every 50 steps" in f.message, f.message
    s.running, s.memory, s.now = True, sampled(last + 560), last + 560
    assert stalls(s)[0].open
    # Healthy: the same steps, the process gone a moment after the last.
    assert not stalls(Series(memory=sampled(last + 2), points=points, config=cfg, devices=[0]))


def test_a_checkpoint_save_inside_a_sparse_gap_is_no_stall():
    # A 5-minute save after steps 500 and 1000 (save_steps 500), inside a 50-step logging gap.
    points = steps_run(steps=1500, every=50, step_s=8.0, pauses={500: 300.0, 1000: 300.0})
    cfg = {"logging_steps": 50, "save_steps": 500}
    assert not stalls(Series(points=points, config=cfg))
    # Without saves in the config, the same 5 minutes are a stall: the save is what allows them.
    assert stalls(Series(points=points, config={**cfg, "save_strategy": "no"}))


def test_an_evaluation_underway_is_no_open_stall():
    # 2 s steps logged every 10, an evaluation of 200 s after every 100th step (its eval_loss point
    # at its end). Live, the trainer has just logged step 300 and evaluates now.
    points, t = [], T0
    for k in range(10, 301, 10):
        t += 20.0
        points.append(Point(t=t, step=k, loss=2.0 - k / 1000))
        if k % 100 == 0 and k < 300:
            t += 200.0
            points.append(Point(t=t, step=k, eval_loss=1.9))
    cfg = {"logging_steps": 10, "eval_strategy": "steps", "eval_steps": 100, "save_strategy": "no"}
    s = Series(points=points, config=cfg, running=True, now=t + 250)
    assert not [f for f in stalls(s) if f.open]
    s.now = t + 2000  # far longer than any evaluation so far
    assert [f for f in stalls(s) if f.open]


def test_a_run_resumed_into_the_same_log_has_no_stall():
    # Live: the old lines of a reused output_dir, then the resumed process's from step 21 on, after
    # five minutes of loading.
    first = [Point(t=T0 + k, step=k + 1, loss=2.0) for k in range(30)]
    then = [Point(t=T0 + 330 + k, step=21 + k, loss=1.9) for k in range(30)]
    assert not stalls(Series(points=first + then, running=True, now=T0 + 360))


def test_an_imported_log_that_restarts_its_elapsed_time_has_no_stall():
    # Steps of 5 s logged every 10 up to 120; the run dies, is resumed from checkpoint-100 ten minutes
    # later into the same log (elapsed_time from 0 again) and trains to 300; the memory sampler ran
    # through all of it.
    def line(step: int, e: int) -> str:
        return f'{{"current_steps": {step}, "loss": 1.5, "elapsed_time": "0:{e // 60:02d}:{e % 60:02d}"}}'

    a = [line(k, 30 + 5 * k) for k in range(10, 121, 10)]
    b = [line(k, 30 + 5 * (k - 100)) for k in range(110, 301, 10)]
    end = 30 + 600 + 600 + 30 + 1000
    csv = "t,gpu,used_bytes,total_bytes\n" + "".join(
        f"{t},0,{30 * GiB},{80 * GiB}\n" for t in range(0, end, 5)
    )
    s, _ = build(trainer_log="\n".join(a + b) + "\n", memory_csv=csv)
    ts = [p.t for p in s.points]
    assert ts == sorted(ts)  # the resumed process's lines come after the first one's
    assert not stalls(s)


def test_a_stall_among_the_first_sparse_points_is_dated_by_the_steps_it_held():
    # Points every 50 steps of 8 s, then 2000 s to the next: too few intervals yet to settle, judged
    # on what there is. Due after 49 more steps (392 s), then the 120 s bar.
    ts = [400.0, 800.0, 1200.0, 1600.0, 3600.0]
    s = Series(points=[Point(t=T0 + t, step=50 * (k + 1), loss=1.0) for k, t in enumerate(ts)])
    (f,) = stalls(s)
    assert f.times == [T0 + 1600.0 + 49 * 8.0 + 120.0] and f.step == 200
