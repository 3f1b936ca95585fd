"""What the corpus tests leave loose and mutants of the detectors showed (bench/mutation.py): each
check here fails on a mutant that every corpus test let through."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests.alerts import realistic
from tunedeck.alerts import analyze
from tunedeck.alerts.memory import HISTORY, LEVEL, NOISE, SMOOTH, WINDOW, levels
from tunedeck.alerts.rundir import BadInput, parse_memory_csv

GiB = 1024**3


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
