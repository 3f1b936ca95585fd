"""A saved detector state takes up where the one it was saved from stood: fed the same samples after,
the restored `Run` finds what the original finds, read by read, over the labelled corpora (memory,
training, hardware) cut at several points. And a snapshot is data only: a blob naming any class
outside tunedeck.alerts, or saved by other detector code, is refused without running anything."""

from __future__ import annotations

import json
import random
import zlib
from dataclasses import asdict

import numpy as np
import pytest

from tests.alerts import realistic
from tests.alerts.corpus import generate, hardware_corpus
from tunedeck.alerts import Run, Series, snapshot
from tunedeck.alerts.series import Occurrences


def ops(s: Series, rng: random.Random) -> list[tuple]:
    """The series as ingest feeds it: each stream in chunks of random size, interleaved at random."""
    left: dict = {("memory", k): list(xs) for k, xs in s.memory.items()}
    for k, (t, cols) in s.hardware.items():
        left[("hardware", k)] = [(t[i], {c: v[i] for c, v in cols.items()}) for i in range(len(t))]
    left["points"], left["logs"] = list(s.points), list(s.logs)
    out = []
    while any(left.values()):
        name = rng.choice([k for k, v in left.items() if v])
        n = rng.choice([1, 2, 3, 8, 40, 150])
        part, left[name] = left[name][:n], left[name][n:]
        out.append((name, part))
    return out


def apply(run: Run, op: tuple) -> None:
    name, part = op
    if name == "points":
        run.feed_points(part)
    elif name == "logs":
        run.feed_logs(part)
    else:
        node, gpu = name[1] if isinstance(name[1], tuple) else ("", name[1])
        if name[0] == "memory":
            run.feed_memory(gpu, [x[0] for x in part], [x[1] for x in part], [x[2] for x in part], node)
        else:
            cols = {c: [x[1][c] for x in part] for c in part[0][1]}
            run.feed_hardware(gpu, [x[0] for x in part], cols, node)


def read(run: Run, now: float) -> list[dict]:
    return [asdict(f) for f in run.findings(running=True, now=now)]


def traces() -> list:
    return [*realistic.generate(0), *generate(0), *hardware_corpus([0])]


@pytest.mark.parametrize("cut", [0.05, 0.6])
def test_a_restored_state_finds_what_the_saved_one_finds(cut):
    rng = random.Random(int(cut * 100))
    found = set()
    for tr in traces():
        steps = ops(tr.series, rng)
        run = Run(tr.series)
        k = int(cut * len(steps))
        for op in steps[:k]:
            apply(run, op)
        if rng.random() < 0.5:
            run.findings(running=True)  # a read before saving: its caches are saved too
        blob = snapshot.dump(run)
        back = snapshot.load_run(blob)
        assert snapshot.dump(back) == blob, tr.name  # the round trip is exact
        rest = steps[k:]
        reads = {len(rest) - 1, *rng.sample(range(len(rest)), min(len(rest), 8))}
        for i, op in enumerate(rest):
            apply(run, op)
            apply(back, op)
            if i in reads:
                now = run.end() + 30
                assert read(back, now) == read(run, now), (tr.name, i)
        found |= {f.kind for f in run.findings(running=False)}
    # The corpora hold findings of every family: the comparison above compared something.
    assert {"vram_spike", "vram_leak", "loss_nan", "gpu_ecc_uncorrectable", "vram_plateau"} <= found


def test_what_two_detectors_shared_they_share_after_loading():
    shared = Occurrences()
    state = {"a": [shared, shared], "b": (shared, np.arange(3.0), np.float64(2.5)), "c": {(1, "x"): {2}}}
    back = snapshot.load(snapshot.dump(state))
    assert back["a"][0] is back["a"][1] is back["b"][0]
    assert isinstance(back["b"][2], np.float64) and back["b"][1].dtype == np.float64
    assert back["c"] == {(1, "x"): {2}}


def blob(state: object, code: str | None = None) -> bytes:
    return zlib.compress(json.dumps({"code": code or snapshot.code(), "state": state}).encode())


@pytest.mark.parametrize(
    ("state", "said"),
    [
        ({"o": "os:system", "v": {}}, "not a class of tunedeck.alerts"),
        ({"o": "builtins:eval", "v": {}}, "not a class of tunedeck.alerts"),
        ({"o": "tunedeck.alerts.memory:OutOfOrder", "v": {}}, "not a state object"),
        ({"n": "tunedeck.alerts.stream:Run", "v": []}, "not a named tuple"),
        ({"a": [1, 2], "dt": "object", "sh": [2]}, "dtype 'object'"),
        ({"a": [1, 2], "dt": "float64", "sh": [3]}, "an array"),
        ([{"r": 5}], "a reference to 5"),
        ({"q": [], "m": -1}, "maxlen"),
        ({"zz": 1}, "an unknown tag"),
        ({"d": [[[1], 2]]}, "a dict key"),
    ],
)
def test_a_blob_that_is_not_a_detector_state_is_refused(state, said):
    with pytest.raises(snapshot.BadSnapshot, match=said):
        snapshot.load(blob(state))


def test_other_detector_code_or_other_bytes_are_refused():
    with pytest.raises(snapshot.Stale, match="other detector code"):
        snapshot.load(blob([1, 2], code="0" * 16))
    with pytest.raises(snapshot.BadSnapshot, match="not a snapshot"):
        snapshot.load(b"\x80\x04not zlib")
    with pytest.raises(snapshot.BadSnapshot, match="not of a Run"):
        snapshot.load_run(snapshot.dump([1, 2]))


def test_a_state_holding_anything_else_cannot_be_saved():
    with pytest.raises(TypeError, match="cannot keep"):
        snapshot.dump({"f": lambda: 0})
    with pytest.raises(TypeError, match="cannot be kept"):
        snapshot.dump(np.array(["x"], dtype=object))
