"""Periodic spikes told by what recurs at their period: checkpoint saves (save_steps, or the
output's save lines), evaluations (eval_steps), logging, the optimizer step; accumulation is advised
only for spikes at every optimizer step. Transients while the job loads are no periodic spikes."""

from __future__ import annotations

import numpy as np

from tunedeck.alerts import Point, Series, analyze

GiB = 1024**3
T0 = 1_900_000_000.0
Z3 = {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}}


def run(
    spikes_every: int, *, steps: int = 1000, step_s: float = 2.0, cfg: dict | None = None, ds=None, logs=()
) -> Series:
    """2 s steps logged every 10 from T0 + 60 (loading before), 1 Hz memory at 30 GiB of 80 with
    +8 GiB for 2 samples after every `spikes_every`-th step."""
    start = T0 + 60
    points = [
        Point(t=start + k * step_s, step=k, loss=2.0 - k / (2 * steps)) for k in range(10, steps + 1, 10)
    ]
    ts = np.arange(T0, start + steps * step_s + 5, 1.0)
    rng = np.random.default_rng(1)
    y = 30 * GiB + rng.normal(0, 0.01 * GiB, len(ts))
    y[ts < start] = 12 * GiB
    for k in range(spikes_every, steps, spikes_every):
        at = ts >= start + k * step_s
        y[np.flatnonzero(at)[:2]] += 8 * GiB
    config = {"gradient_accumulation_steps": 4, "logging_steps": 10, **(cfg or {})}
    return Series(
        memory={0: [(float(a), int(b), 80 * GiB) for a, b in zip(ts, y)]},
        points=points,
        logs=list(logs),
        config=config,
        ds=ds,
        devices=[0],
    )


def periodic(s: Series):
    (f,) = [f for f in analyze(s) if f.kind == "vram_periodic_spikes"]
    return f


def test_a_zero3_save_gather_is_information_not_a_change_of_accumulation():
    f = periodic(run(100, cfg={"save_steps": 100}, ds=Z3))
    assert f.severity == "info" and f.change is None, f
    assert (
        "at each checkpoint save" in f.message and "stage3_gather_16bit_weights_on_model_save" in f.suggestion
    )
    assert "+8.0 GiB of headroom" in f.suggestion and "gradient_accumulation_steps is" not in f.suggestion


def test_spikes_at_the_outputs_save_lines_are_the_saves():
    # Saved by epoch (no save_steps to match): the output's lines say when each save began.
    logs = [
        (T0 + 60 + k * 2.0, f"Saving model checkpoint to out/checkpoint-{k}") for k in range(120, 1000, 120)
    ]
    f = periodic(run(120, cfg={"save_strategy": "epoch"}, logs=logs))
    assert f.severity == "info" and "checkpoint save" in f.message and f.change is None
    assert periodic(run(120, cfg={"save_strategy": "epoch"})).severity == "warning"  # without them: no cause


def test_spikes_every_eval_steps_are_the_evaluations():
    # No eval_loss points place the phases (the sampler's clock and the log's disagree): the period does.
    cfg = {"eval_strategy": "steps", "eval_steps": 50, "per_device_eval_batch_size": 8}
    f = periodic(run(50, cfg=cfg))
    assert f.severity == "info" and f.change == {"per_device_eval_batch_size": 4}
    assert "at each evaluation" in f.message


def test_spikes_at_every_optimizer_step_are_the_steps_own_memory_and_accumulation_is_no_cure():
    # The step holds its gradients and the optimizer's update: as high at any accumulation, which only
    # sets how often it comes. No key change claims to lower it.
    f = periodic(run(1, steps=200, step_s=5.0))
    assert f.severity == "warning" and f.change is None, f
    assert "the optimizer step's own working memory" in f.suggestion
    assert "that sets how often, not how high" in f.suggestion
    f = periodic(run(7))  # every 7 steps: nothing in the config recurs so; not the optimizer step either
    assert f.severity == "warning" and "gradient_accumulation_steps" not in (f.change or {})
    f = periodic(run(20, cfg={"logging_steps": 20}))  # with each logged step
    assert "with each logged step (logging_steps 20)" in f.suggestion and not f.change


def test_transients_while_the_job_loads_are_no_periodic_spikes():
    # Weights arriving in shards: a transient every 8 s in the first minute, then flat training.
    s = run(10**6)
    y = [list(x) for x in s.memory[0]]
    for t0 in range(8, 56, 8):
        y[t0][1] += 6 * GiB
    s.memory[0] = [tuple(x) for x in y]
    assert "vram_periodic_spikes" not in {f.kind for f in analyze(s)}


def test_one_spike_at_a_configured_save_is_that_save_and_at_the_default_one_a_spike():
    f = only_spike(run(500, steps=800, cfg={"save_steps": 500}, ds=Z3))
    assert f.severity == "info" and "at each checkpoint save" in f.message
    # The Trainer's default of 500 alone, with no save line, is too weak a match: a spike is a spike.
    f = only_spike(run(500, steps=800, ds=Z3))
    assert f.severity == "warning" and "one-off peak" in f.suggestion


def only_spike(s: Series):
    (f,) = [f for f in analyze(s) if f.kind == "vram_spike"]
    return f
