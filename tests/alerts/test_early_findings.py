"""A device's findings in its first samples (the early phase, before EARLY of them settle the first
samples' rule) are read without touching the detector's state: the same findings as the version
that judged a deep copy of the whole detector on every read, on a few traces fed sample by sample
and in chunks (`early_findings.json`, written by that version: `python -m
tests.alerts.test_early_findings` writes it again from the code at hand), and a detector read at
every batch ends where one never read ends."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from tests.alerts import realistic
from tunedeck.alerts import Series
from tunedeck.alerts.memory import EARLY
from tunedeck.alerts.stream import Run

FIXTURE = Path(__file__).with_name("early_findings.json")
GiB = 1024**3
TOTAL = 192 * GiB
T0 = 1_800_000_000.0
N = EARLY + 3  # through the early phase and a few samples past it


def cases() -> dict[str, list[float]]:
    """Memory traces (bytes, one a second) whose first samples hold what the early rule judges."""
    gib = {
        "loading_peak": [2, 40, 70, 40, 40, 41, 40, 40, 40, 41, 40, 40, 40, 40, 40],
        "peak_then_judged_spike": [2, 40, 70, 40, 40, 40, 40, 40, 40, 40, 40, 40, 75, 40, 40],
        "spike_past_history": [40, 40, 40, 40, 40, 40, 75, 40, 40, 40, 40, 40, 40, 40, 40],
        "still_up": [40, 40, 40, 40, 40, 40, 40, 40, 75, 76, 40, 40, 40, 40, 40],
        "wide_early": [2, 40, 70, 72, 71, 40, 40, 40, 40, 40, 40, 40, 40, 40, 40],
        "climb_to_near_oom": [0, 10, 25, 40, 185, 186, 187, 186, 185, 186, 40, 40, 40, 40, 40],
    }
    out = {k: [v * GiB + (i % 3) * 2**20 for i, v in enumerate(ys)] for k, ys in gib.items()}
    for seed in range(3):  # noise around a level, a spike somewhere in the first samples
        rng = np.random.default_rng(seed)
        y = 30 * GiB + rng.normal(0, 0.2 * GiB, N)
        y[rng.integers(1, EARLY)] += 20 * GiB
        out[f"noisy_{seed}"] = y.round().tolist()
    for scenario in ("spike", "healthy"):  # the corpus's runs: loading in shards, the warm-up
        trace = realistic.simulate(3, scenario)
        mem = sorted(trace.series.memory[0])
        out[f"realistic_{scenario}"] = [float(m[1]) for m in mem[:N]]
    return out


def read(y: list[float], chunk: int) -> tuple[list, Run]:
    """The findings after each chunk of `chunk` samples, live (running, now = the newest sample)."""
    run = Run(Series(config={"cutoff_len": 2048}, devices=[0], running=True))
    seen = []
    for i in range(0, len(y), chunk):
        t = [T0 + k for k in range(i, min(len(y), i + chunk))]
        run.feed_memory(0, t, y[i : i + chunk], [TOTAL] * len(t))
        seen.append([dataclasses.asdict(f) for f in run.findings(running=True, now=t[-1])])
    return seen, run


def findings() -> dict[str, dict[str, list]]:
    return {name: {str(c): read(y, c)[0] for c in (1, 3)} for name, y in cases().items()}


def test_early_findings_are_those_the_copy_based_version_gave():
    want = json.loads(FIXTURE.read_text())
    got = json.loads(json.dumps(findings()))
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == want[name], name
    assert sum(bool(f) for case in want.values() for f in case["1"]) > 20  # the traces find things


def test_reading_findings_in_the_early_phase_leaves_the_detector_as_it_was():
    for name, y in cases().items():
        _, read_often = read(y, 1)
        never = Run(Series(config={"cutoff_len": 2048}, devices=[0], running=True))
        never.feed_memory(0, [T0 + k for k in range(len(y))], y, [TOTAL] * len(y))
        now = T0 + len(y) - 1
        assert read_often.findings(running=True, now=now) == never.findings(running=True, now=now), name


def test_an_early_read_copies_no_state():
    """A read per batch of every device of a cluster: a deep copy of each detector was most of the
    engine's cost while its devices were in their first samples."""
    y = cases()["loading_peak"][: EARLY - 1]
    run = Run(Series(config={"cutoff_len": 2048}, devices=[0], running=True))
    run.feed_memory(0, [T0 + k for k in range(len(y))], y, [TOTAL] * len(y))
    called: list[str] = []

    def profile(frame, event, _arg) -> None:
        if event == "call":
            called.append(f"{Path(frame.f_code.co_filename).stem}.{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        (found,) = run.findings(running=True, now=T0 + len(y) - 1)
    finally:
        sys.setprofile(None)
    assert found.kind == "vram_spike" and "copy.deepcopy" not in called


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(findings(), indent=0, sort_keys=True) + "\n")
    sys.exit(0)
