"""The memory detectors pass over quiet samples in bulk (numpy over the batch) and judge one by one
only where something is up or rising: what they keep and find is exactly what judging every sample
one by one keeps and finds, however the samples were cut into batches."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from numpy.lib.stride_tricks import sliding_window_view

from tests.alerts.corpus import T0, TOTAL, generate
from tunedeck.alerts import Run, Series
from tunedeck.alerts.memory import NOISE, SMOOTH, WINDOW, Gpu, noise_smooth

GiB = 1024**3


def random_traces(seed: int) -> list[Series]:
    """Noisy memory with spikes, wide excursions, level changes, drops and near-OOM stretches; some
    only a few samples long (the first samples' rule), some without a capacity; one long enough for
    the plateau's blocks to hold many samples each."""
    rng = np.random.default_rng(seed)
    out = []
    for i, n in enumerate([3, 11, 14, 40, 900, 2500, 9000, 2500]):
        t = T0 + np.cumsum(rng.uniform(0.5, 3.0, n))
        y = 60 * GiB + rng.normal(0, rng.choice([1e6, 1e8, 1e9]), n)
        hit = rng.random(n) < 0.02
        y[hit] += rng.uniform(0.5, 40, hit.sum()) * GiB
        for _ in range(2):  # a wider excursion, up for a while then back (or not)
            a = int(rng.integers(0, n))
            y[a : a + int(rng.integers(2, 90))] += rng.uniform(5, 30) * GiB
        if i % 3 == 0:
            y[n // 2 :] -= 40 * GiB
        if i % 4 == 1:
            y[n // 3 : n // 3 + 20] = 0.97 * TOTAL
        total = [TOTAL if i % 2 else None] * n
        out.append(Series(memory={0: list(zip(t.tolist(), y.astype(np.int64).tolist(), total))}))
    return out


def traces() -> list[Series]:
    return [tr.series for tr in generate(0)] + random_traces(0)


def fed(s: Series, cuts, bulk: bool = True) -> Run:
    run = Run(s)
    for key, xs in s.memory.items():
        node, gpu = key if isinstance(key, tuple) else ("", key)
        run.gpus[(node, gpu)] = Gpu(gpu, run.limits, bulk=bulk)
        xs = sorted(xs, key=lambda x: x[0])
        ends = cuts(len(xs))
        for a, b in zip(ends[:-1], ends[1:]):
            part = xs[a:b]
            run.feed_memory(gpu, [x[0] for x in part], [x[1] for x in part], [x[2] for x in part], node)
    run.feed_points(s.points)
    run.feed_logs(s.logs)
    return run


def state(g: Gpu) -> str:
    """As text: floats written exactly, and a NaN (the first sample's level) equal to itself."""
    ups = [(e.t0, e.base, e.thr, e.peak, e.n, e.settled, list(e.recent)) for e in g._up]
    occ = [(o.n, o.first, list(o.recent)) for o in (g.spikes, g.near)]
    scalars = (g.n, g.t_first, g.t_last, g.total, g.largest, g.widest, g.run, g.longest, g.near_peak, g.block)
    return repr((scalars, g.calm_from, list(g.records), occ, ups, g._early, g.blocks, g._cur, list(g._hist)))


def seen(run: Run) -> list:
    """Everything the run keeps and finds, live (running) and once ended."""
    found = [
        [dataclasses.asdict(f) for f in run.findings(running=running, now=run.end() + 30)]
        for running in (True, False)
    ]
    return [found, {k: state(g) for k, g in run.gpus.items()}]


def test_bulk_equals_one_by_one_for_any_batching():
    rng = random.Random(7)
    whole, samples, skipped = lambda n: [0, n], 0, 0
    one_by_one = lambda n: list(range(n + 1)) if n <= 3000 else [0, n]  # (the long one: cut at random)
    some = lambda n: sorted({0, n, *rng.sample(range(n + 1), min(n, rng.choice([2, 9, 60])))})
    for s in traces():
        ref = fed(s, whole, bulk=False)
        assert all(g.skipped == 0 for g in ref.gpus.values())
        reference = seen(ref)
        for cuts in (whole, one_by_one, some):
            run = fed(s, cuts)
            assert seen(run) == reference
            if cuts is whole:
                samples += sum(g.n for g in run.gpus.values())
                skipped += sum(g.skipped for g in run.gpus.values())
    # The bulk path did the work: most samples were never judged one by one.
    assert skipped > 0.7 * samples, (skipped, samples)


@pytest.mark.parametrize("scale", [1.0, 1e8])
def test_noise_and_smoothing_are_the_medians_of_their_windows(scale):
    """The fast medians give np.median's values to the bit, ties and flat stretches included."""
    rng = np.random.default_rng(3)
    y = np.concatenate([rng.integers(0, 4, 300) * scale, np.full(80, 7.0), rng.normal(0, scale, 300)])
    h = WINDOW + 1
    noise, smooth = noise_smooth(y, h)
    d = sliding_window_view(np.diff(y)[:-1], WINDOW)[h - 1 - WINDOW :]
    mad = np.array([np.median(np.abs(w - np.median(w))) for w in d]) * NOISE
    med = np.array([np.median(w) for w in sliding_window_view(y, SMOOTH)[h - SMOOTH + 1 :]])
    assert np.array_equal(noise, mad)
    assert np.array_equal(smooth, med)
