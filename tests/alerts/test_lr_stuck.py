"""A flat loss under a learning rate of about 0 (issue 28 §3): `loss_stuck` judged against the noise.

Batch noise of a few % per logged point keeps the loss outside the flat band (0.5 % of its level), so
the band alone never calls it stuck. With the `lr` column the engine sees the scheduler's rate: peaked
at no more than 1 % of the configured learning_rate (or that itself far below the usual range) while
the fitted slope of the last 20 to 60 losses is not 3 standard errors below zero: stuck, with the
cause named and a `change` that addresses it. The lr reaches the engine from the stored metric rows
(the tracker) and from a run folder's trainer_log.jsonl (`analyze`).
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from sqlmodel import Session

from tests.alerts.test_streaming import chunked, key
from tests.utils.wait import DEADLINE
from tunedeck.alerts import Point, Series, analyze
from tunedeck.alerts.rundir import parse_trainer_log
from tunedeck.services.alerting import tracker as detectors
from tunedeck.services.ingest.writer import IngestWriter
from tunedeck.store.db import make_engine, upgrade
from tunedeck.store.tables import Job, JobStatus

T0 = 1_800_000_000.0
N = 80


def curve(*, noise: float = 0.04, fall: float = 0.0, seed: int = 0, n: int = N) -> np.ndarray:
    """A loss at 2.5 with `noise` per logged point, falling by `fall` of its level over the run."""
    rng = np.random.default_rng(seed)
    return 2.5 * (1 - fall * np.arange(n) / n) * (1 + rng.normal(0, noise, n))


def series(losses, lr, config: dict, *, running: bool = False) -> Series:
    """`lr`: the logged rate at each point (a function of its index), or None for no lr column."""
    pts = [
        Point(t=T0 + 10 * k, step=k + 1, loss=float(v), lr=None if lr is None else float(lr(k)))
        for k, v in enumerate(losses)
    ]
    return Series(points=pts, config=config, running=running)


def stuck(s: Series, seed: int = 0) -> list:
    whole = analyze(s)
    assert key(chunked(s, random.Random(seed)).findings(running=s.running)) == key(whole)
    return [f for f in whole if f.kind == "loss_stuck"]


LORA = {"finetuning_type": "lora", "learning_rate": 1e-4}


@pytest.mark.parametrize("seed", range(5))
def test_a_noisy_flat_loss_under_a_learning_rate_of_0_is_stuck(seed):
    losses = curve(seed=seed)
    # The same losses under the configured rate: noise, not stuck (the flat band misses them).
    assert stuck(series(losses, lambda k: 1e-4, LORA), seed) == []
    (f,) = stuck(
        series(losses, lambda k: 0.0, {**LORA, "lr_scheduler_type": "polynomial"}, running=True), seed
    )
    assert f.severity == "warning" and f.open and f.step == 1
    assert "the learning rate peaked at 0, 0% of learning_rate 0.0001" in f.message
    assert "within its noise" in f.message and "loss flat since step 1" in f.message
    # A scheduler that gives ~0 from the start: the scheduler is the cause, and what the change sets.
    assert f.change == {"lr_scheduler_type": "cosine"} and "lr_scheduler_type polynomial" in f.suggestion
    # Found once 20 losses are there, and at every point since.
    assert f.first == T0 + 10 * 19 and f.count == N - 19


def test_cosine_already_set_gets_another_schedule():
    (f,) = stuck(series(curve(), lambda k: 1e-9, {**LORA, "lr_scheduler_type": "cosine"}))
    assert f.change == {"lr_scheduler_type": "constant_with_warmup"}


def test_learning_rate_0_in_the_config_needs_no_lr_column():
    (f,) = stuck(series(curve(), None, {"finetuning_type": "lora", "learning_rate": 0}))
    assert "while learning_rate is 0" in f.message
    assert f.change == {"learning_rate": 1e-4} and "far below the 1e-05 to 1e-03" in f.suggestion
    # Far below the usual range (a typo's exponent) is the same slip; full fine-tunes have their own range.
    (f,) = stuck(series(curve(), None, {"finetuning_type": "full", "learning_rate": 5e-9}))
    assert f.change == {"learning_rate": 1e-5}
    # At the bottom of the usual range it is a choice: not judged without the lr column.
    assert stuck(series(curve(), None, {"finetuning_type": "full", "learning_rate": 1e-6})) == []


def test_a_warmup_longer_than_the_run_is_named():
    cfg = {**LORA, "warmup_steps": 100_000}
    (f,) = stuck(series(curve(), lambda k: 1e-4 * (k + 1) / 100_000, cfg))
    assert f.change == {"warmup_steps": 0, "warmup_ratio": 0.1}
    assert "warm-up ramp (warmup_steps 100000)" in f.suggestion


def test_the_peak_so_far_decides_not_the_newest_rate():
    # Warm-up and a cosine decay to 0: a healthy run whose loss levels off at its end stays unjudged,
    # though its last rates are far below 1 % of the configured one.
    n = 400
    k = np.arange(n)
    lr = np.where(k < 40, 1e-4 * (k + 1) / 40, 1e-4 * 0.5 * (1 + np.cos(np.pi * (k - 40) / (n - 40))))
    losses = 0.8 + 1.7 * np.exp(-k / 60) * 1 + np.random.default_rng(1).normal(0, 0.03, n)
    assert stuck(series(losses, lambda i: lr[i], LORA)) == []


@pytest.mark.parametrize(("peak", "found"), [(2e-6, False), (0.9e-6, True)])
def test_the_rate_must_stay_within_1_percent(peak, found):
    assert bool(stuck(series(curve(), lambda k: peak, LORA))) == found


def test_a_loss_that_falls_beyond_its_noise_is_learning():
    # The same tiny rate, but the loss falls 30 % over the run with 2 % noise: significantly negative
    # from the first 20 points on.
    assert stuck(series(curve(noise=0.02, fall=0.3), lambda k: 0.0, LORA)) == []
    # Falling 1 % under 4 % noise is within it.
    assert stuck(series(curve(noise=0.04, fall=0.01), lambda k: 0.0, LORA))


def test_too_few_points_or_rates_are_not_judged():
    assert stuck(series(curve(n=19), lambda k: 0.0, LORA)) == []
    # 30 losses, only 19 of them with the lr logged: the log has not shown the rate long enough.
    s = series(curve(n=30), lambda k: 0.0, LORA)
    for p in s.points[19:]:
        p.lr = None
    assert stuck(s) == []


def test_a_constant_loss_under_lr_0_is_stuck():
    # No noise at all: a slope of 0 against a standard error of 0.
    (f,) = stuck(series(np.full(40, 2.0), lambda k: 0.0, {"learning_rate": 0}))
    assert f.change == {"learning_rate": 1e-4}


def test_the_run_folder_reader_keeps_the_lr():
    lines = [
        json.dumps({"current_steps": k, "loss": 2.0, "lr": 1e-6 * k, "elapsed_time": f"0:00:{k:02d}"})
        for k in (1, 2)
    ]
    points, _ = parse_trainer_log(lines, T0)
    assert [p.lr for p in points] == [1e-6, 2e-6]


def test_the_tracker_reads_the_lr_column(tmp_path):
    engine = make_engine(tmp_path / "t.db")
    upgrade(engine)
    with Session(engine) as session:
        job = Job(
            name="j", spec="{}", train_yaml="learning_rate: 1.0e-4\n", status=JobStatus.running, devices="0"
        )
        session.add(job)
        session.commit()
        job_id = job.id
    losses = curve(seed=3)
    metrics = [
        {
            "line": k,
            "t": T0 + 10 * k,
            "raw": json.dumps({"current_steps": k + 1, "loss": float(v), "lr": 0.0}),
        }
        for k, v in enumerate(losses)
    ]
    writer = IngestWriter(engine)
    writer.start()
    try:
        batch = {"seq": 0, "memory": [], "metrics": metrics, "logs": [], "states": []}
        writer.submit(job_id, batch).result(timeout=DEADLINE)
        tracker = detectors.Tracker(engine, detectors.Limits())
        found = {a.kind: a for a in tracker.evaluate(job_id, now=T0 + 10 * N)}
    finally:
        writer.stop()
    assert "learning rate peaked at 0" in found["loss_stuck"].message
