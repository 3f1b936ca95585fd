"""One GPU drifting away from its peers while they hold (issue 28 §3): `gpu_drift`.

Each GPU is put on a common time grid after warm-up; a GPU whose own move (now against early) less the
peers' median move exceeds 5 % of its card and 5 MADs of the peers' moves, while the peers' own median
move stays within half of it, drifts. Steady offsets between GPUs (rank 0 keeps more, uneven data) are
no drift, nor is a move of every GPU together, nor anything on a single GPU. Judged whole and fed in
chunks, the same.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from tests.alerts.test_streaming import chunked, key
from tunedeck.alerts import Point, Series, analyze

GiB = 1024**3
T0 = 1_900_000_000.0
CARD = 80 * GiB


def job(
    gpus: int,
    *,
    drift: dict[int, float] | None = None,
    offsets: list[float] | None = None,
    common: float = 0.0,
    noise: float = 0.05,
    seed: int = 0,
    step_at: float = 900.0,
    nodes: bool = False,
    ramp_s: float | None = None,
) -> Series:
    """30 minutes at 1 Hz on 80 GiB cards at 40 GiB (+ offsets, GiB), loading in the first minute;
    `drift`: gpu -> share of the card it moves by, linearly from `step_at` s to the end; `common`: a
    share every GPU moves by the same way; `ramp_s`: the move is done that long after `step_at`."""
    rng = np.random.default_rng(seed)
    t = np.arange(T0, T0 + 1800, 1.0)
    memory: dict = {}
    for g in range(gpus):
        y = (40 + (offsets[g] if offsets else 0.0)) * GiB + rng.normal(0, noise * GiB, len(t))
        on = t > T0 + step_at
        ramp = np.where(on, np.minimum(1.0, (t - T0 - step_at) / (ramp_s or 1800 - step_at)), 0.0)
        y += common * CARD * ramp + (drift or {}).get(g, 0.0) * CARD * ramp
        y[t < T0 + 60] = 10 * GiB
        rows = [(float(a), int(b), CARD) for a, b in zip(t, y)]
        memory[("node-a" if g % 2 == 0 else "node-b", g // 2) if nodes else g] = rows
    points = [Point(t=T0 + 60 + 5 * k, step=k + 1, loss=2.0 * 0.999**k) for k in range(340)]
    return Series(memory=memory, points=points, devices=list(range(gpus)))


def drifts(s: Series, seed: int = 0) -> list:
    whole = analyze(s)
    if all(isinstance(k, int) for k in s.memory):  # (the chunked feed names no nodes)
        assert key(chunked(s, random.Random(seed)).findings(running=False)) == key(whole)
    return [f for f in whole if f.kind == "gpu_drift"]


@pytest.mark.parametrize(("gpus", "which"), [(2, 1), (2, 0), (4, 2), (8, 5)])
@pytest.mark.parametrize("sign", [1, -1])
def test_one_gpu_moving_away_is_named(gpus, which, sign):
    (f,) = drifts(job(gpus, drift={which: sign * 0.09}))
    assert f.gpu == which and f.severity == "warning"
    assert ("rose" if sign > 0 else "fell") in f.message and "while theirs held" in f.message
    # When it began: the move starts at 900 s (step 168); the onset is read off the grid.
    assert 150 <= f.step <= 230, f.message
    assert "py-spy dump the process on GPU" in f.suggestion and f.change is None


def test_a_small_move_is_none():
    # 3 % of the card: within what uneven data moves a rank by.
    assert drifts(job(4, drift={1: 0.03})) == []
    assert drifts(job(4, drift={1: 0.07}))


def test_single_gpu_runs_never_get_it():
    assert drifts(job(1, drift={0: 0.3})) == []


def test_steady_uneven_gpus_are_healthy():
    assert drifts(job(4, offsets=[2.0, -3.0, 6.0, 0.5], noise=0.3)) == []
    assert drifts(job(8, offsets=[3.0, 0, 0, -4.0, 1.0, 0, 7.0, -1.0])) == []


def test_every_gpu_moving_together_is_no_drift():
    assert drifts(job(4, common=0.2)) == []
    assert drifts(job(2, common=-0.15)) == []


def test_peers_that_do_not_hold_single_none_out():
    # Two of four GPUs move, by different amounts: the other two's median moves half the way.
    assert drifts(job(3, drift={0: 0.08, 1: 0.12})) == []
    # Peers that each move about on their own: their MAD is the bar, not 5 % of the card.
    wild = {0: 0.10, 1: -0.08, 2: 0.14, 3: -0.12, 4: 0.2}
    assert drifts(job(5, drift=wild)) == []


def test_a_leak_on_one_rank_is_both():
    s = job(4, drift={3: 0.35}, step_at=120.0)
    kinds = {(f.kind, f.gpu) for f in analyze(s)}
    assert {("vram_leak", 3), ("gpu_drift", 3)} <= kinds


def test_gpus_of_several_nodes_are_peers_and_the_node_is_named():
    (f,) = drifts(job(4, drift={1: 0.1}, nodes=True))
    assert (f.node, f.gpu) == ("node-b", 0) and f.message.startswith("node-b GPU 0:")


def test_too_short_a_stretch_is_not_judged():
    s = job(2, drift={1: 0.09}, step_at=200.0, ramp_s=60.0)
    for rows in s.memory.values():
        del rows[400:]  # 400 s: under five minutes after warm-up (the first minute, and a minute more)
    assert drifts(s) == []
    assert drifts(job(2, drift={1: 0.09}, step_at=700.0, ramp_s=60.0))  # the same move in a longer run


def test_spikes_up_most_of_the_time_are_no_drift():
    # Spikes of 10 GiB at every optimizer step (4 samples), on both GPUs: on GPU 0 held 3 samples of
    # every 4 for the first half, then 1, on GPU 1 1 of every 4 all along. The median of 9 samples sat on
    # GPU 0's spikes' top for the first half: a fall of 12 % of the card read as a drift. What either
    # stands on between spikes never moved.
    s = job(2)
    for g, rows in s.memory.items():
        for i, (t, y, total) in enumerate(rows):
            held = 3 if g == 0 and t < T0 + 900 else 1
            if t >= T0 + 60 and i % 4 < held:
                rows[i] = (t, y + 10 * GiB, total)
    assert drifts(s) == []


def test_a_step_down_early_in_the_stretch_is_read_from_before_it():
    # The stretch judged runs from about 180 s to the end; a GPU that falls by 9 % of its card at 450 s
    # (in its first quarter, past its first eighth) drifted. Read over the first quarter at its 10th
    # percentile, the level "early" was already the fallen one.
    (f,) = drifts(job(4, drift={2: -0.09}, step_at=450.0, ramp_s=20.0))
    assert f.gpu == 2 and "fell" in f.message


def test_a_drift_is_read_up_to_where_the_process_freed_the_card():
    # A sample every 2 s (the blocks hold 2 samples each), and the job ends freeing every card for its
    # last 10 samples: the floor under spikes falls within 2 samples, the smoothed median only after 5;
    # read up to where the median fell, the freed card was every GPU's level "now" and the peers no
    # longer held.
    s = job(4, drift={1: 0.09})
    for g, rows in s.memory.items():
        rows = s.memory[g] = rows[::2]
        rows[-10:] = [(t, int(0.5 * GiB), total) for t, _, total in rows[-10:]]
    (f,) = drifts(s)
    assert f.gpu == 1 and "rose" in f.message
