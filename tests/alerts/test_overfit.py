"""Overfitting: the eval loss turns up while the train loss keeps falling; told with the step where
it turned, and, for a finished run with num_train_epochs, the epochs that end there."""

from __future__ import annotations

import numpy as np
import pytest

from tunedeck.alerts import Point, Series, analyze

T0 = 1_900_000_000.0


def run(eval_curve, seed: int = 0, running: bool = False) -> Series:
    """300 steps logged every 5 (noisy falling train loss), an eval every 30 steps."""
    rng = np.random.default_rng(seed)
    points = []
    for k in range(5, 301, 5):
        points.append(
            Point(t=T0 + 2 * k, step=k, loss=float(2.0 * np.exp(-k / 150) * (1 + rng.normal(0, 0.03))))
        )
        if k % 30 == 0:
            points.append(Point(t=T0 + 2 * k + 1, step=k, eval_loss=float(eval_curve(k))))
    return Series(points=points, config={"num_train_epochs": 3.0}, running=running)


def overfit(s: Series) -> list:
    return [f for f in analyze(s) if f.kind == "loss_overfit"]


@pytest.mark.parametrize("seed", range(3))
def test_an_eval_loss_that_turns_up_while_training_falls_is_overfitting(seed):
    turn = 120
    (f,) = overfit(run(lambda k: 1.6 - 0.002 * min(k, turn) + 0.003 * max(0, k - turn), seed))
    assert f.step == turn and "its lowest" in f.message, f.message
    assert f.change == {"num_train_epochs": round(3.0 * turn / 300, 2)}
    assert overfit(run(lambda k: 1.6 - 0.002 * min(k, turn) + 0.003 * max(0, k - turn), seed, True))[0].open


@pytest.mark.parametrize("seed", range(3))
def test_an_eval_loss_that_follows_training_or_wobbles_is_not(seed):
    rng = np.random.default_rng(seed)
    assert not overfit(run(lambda k: 1.7 * np.exp(-k / 150), seed))
    assert not overfit(run(lambda k: 1.2 * (1 + 0.02 * rng.normal()), seed))  # flat, within 5 %


@pytest.mark.parametrize("seed", range(3))
def test_a_loss_that_freezes_higher_after_a_fast_descent_is_not_overfitting(seed):
    """Train and eval both freeze 20 % above where they were at step 100 (a stuck run, its eval 5 %
    over its train loss all along): the train loss rose too. Read from the points' trailing mean,
    which lags the fast descent before the lowest eval, it had seemed to fall."""
    rng = np.random.default_rng(seed)
    points = []
    for k in range(1, 201):
        clean = 3.0 * np.exp(-min(k, 100) / 20) * (1.2 if k > 100 else 1.0)
        loss = float(clean * (1 + rng.normal(0, 0.002)))
        points.append(Point(t=T0 + 2 * k, step=k, loss=loss))
        if k % 5 == 0:
            points.append(Point(t=T0 + 2 * k + 1, step=k, eval_loss=1.05 * loss))
    assert not overfit(Series(points=points, config={}, running=False))
