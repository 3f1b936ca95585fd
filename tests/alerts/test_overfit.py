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


def evals_series(eval_at, train_at, steps: int, every: int, seed: int = 0) -> Series:
    """A train point every step and an eval every `every` steps, from the two curves."""
    rng = np.random.default_rng(seed)
    points = []
    for k in range(1, steps + 1):
        points.append(Point(t=T0 + 2 * k, step=k, loss=float(train_at(k, rng))))
        if k % every == 0:
            points.append(Point(t=T0 + 2 * k + 1, step=k, eval_loss=float(eval_at(k, rng))))
    return Series(points=points, config={}, running=False)


def falling(k, rng):
    return 2.0 * np.exp(-k / 400) * (1 + rng.normal(0, 0.01))


@pytest.mark.parametrize("seed", range(3))
def test_a_fast_fall_then_a_slower_rise_is_overfitting(seed):
    """18 evals: the eval loss falls fast (an exponential, halving in 2 evals) and turns up after the
    10th by 4 % an eval (0.3 % noise). Its steps from one eval to the next change all along (a MAD of
    them read several % of noise, and the rise stayed within 4 of it); its second differences do not.
    """

    def ev(k, rng):
        i = k // 40
        return (1 + 1.2 * np.exp(-i / 3) + 0.04 * max(0, i - 9)) * (1 + rng.normal(0, 0.003))

    (f,) = overfit(evals_series(ev, falling, 720, 40, seed))
    assert f.step == 360, f.message


@pytest.mark.parametrize("seed", range(3))
def test_an_eval_loss_that_comes_back_below_its_lowest_was_no_turn(seed):
    """The eval loss rises 15 % over 4 evals while training falls, then falls again below its lowest
    (the eval sampling a swing): a finished run has no overfitting to tell."""

    def ev(k, rng):
        i = k // 20
        bump = [0.0, 0.06, 0.1, 0.13, 0.15, 0.08, 0.0][i - 5] if 5 <= i <= 11 else 0.0
        return 1.2 * np.exp(-k / 3000) * (1 + bump) * (1 + rng.normal(0, 0.002))

    assert not overfit(evals_series(ev, falling, 400, 20, seed))


@pytest.mark.parametrize("seed", range(3))
def test_a_train_loss_that_froze_right_after_the_lowest_eval_is_no_overfitting(seed):
    """The train loss falls fast to step 100 and freezes there (the median of its last points at the
    lowest eval still stood 10 % higher); the eval loss then creeps up: the train loss no longer
    falls, so it is no overfitting."""

    def train(k, rng):
        return 3.0 * np.exp(-min(k, 100) / 20) * (1 + rng.normal(0, 0.0002))

    def ev(k, rng):
        line = 1 + 0.03 * abs(k - 100) / 10  # down to step 100 and up after it, 3 % an eval
        return 1.05 * 3.0 * np.exp(-5) * line * (1 + rng.normal(0, 0.001))

    assert not overfit(evals_series(ev, train, 300, 10, seed))


@pytest.mark.parametrize("seed", range(3))
def test_a_lowest_eval_that_was_a_dip_of_its_noise_is_no_turn(seed):
    """The eval loss is noisy (5 %) and its lowest is a dip 8 % under its curve; then it freezes at
    the curve (the evals of a run whose updates stopped): 9 % over that lowest and many sigmas of the
    frozen evals' noise, but within 4 of the noise it had when the lowest came."""

    def ev(k, rng):
        clean = 1.5 * np.exp(-min(k, 200) / 300)
        return clean * (0.92 if k == 200 else 1.0 if k > 200 else 1 + rng.normal(0, 0.05))

    assert not overfit(evals_series(ev, falling, 500, 10, seed))
