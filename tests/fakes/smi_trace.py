"""The scripted trace the SMI stand-ins replay (shared by the amdsmi and pynvml stand-ins).

`TUNEDECK_FAKE_SMI_TRACE` names a JSON file: {"devices": [{"name", "bdf", "total", "vram": [bytes, ...],
"activity", "power", "temp", "processes": [{"pid", "vram"}]}], "gate": {...}}. Each memory query of a
device returns that device's next value; past the end the last value holds. The trace is keyed to
reads, never to the wall clock, so a slow start shifts nothing.

"gate" (optional): {"at": k, "log": path, "step": n}: the reads stop before value k (repeating value
k-1) until the trainer log `path` (relative to the working directory: a runner works in its run
folder) holds a line with current_steps >= n. An event in the trace then lands mid-training, with
all the reads before it as its baseline, however long the trainer takes to start.

`TUNEDECK_FAKE_SMI_READS` (optional) names a file that gets "device read-number unix-time" for each
memory read: when a scripted event was first seen, for benchmarks that time what follows it.
"""

from __future__ import annotations

import json
import os
import time

_state: dict = {}


def load() -> dict:
    path = os.environ.get("TUNEDECK_FAKE_SMI_TRACE")
    if not path:
        raise RuntimeError("no scripted trace (TUNEDECK_FAKE_SMI_TRACE)")
    if _state.get("path") != path:
        with open(path) as f:
            _state.update(path=path, trace=json.load(f), calls={}, open=False)
    return _state["trace"]


def devices() -> list[dict]:
    return load()["devices"]


def _gate_open(gate: dict) -> bool:
    if not _state["open"]:
        try:
            with open(gate["log"], encoding="utf-8") as f:
                steps = [json.loads(x).get("current_steps") or 0 for x in f if x.strip().startswith("{")]
        except (OSError, ValueError):
            steps = []  # not written yet, or a line half written: ask again at the next read
        _state["open"] = any(s >= gate["step"] for s in steps)
    return _state["open"]


def reads(i: int) -> int:
    """How many memory reads of device i there have been."""
    load()
    return _state["calls"].get(i, 0)


def used(i: int) -> int:
    tr = load()
    values = tr["devices"][i]["vram"]
    k = _state["calls"].get(i, 0)
    gate = tr.get("gate")
    if gate and k >= gate["at"] and not _gate_open(gate):
        return int(values[min(gate["at"], len(values)) - 1])
    _state["calls"][i] = k + 1
    if reads := os.environ.get("TUNEDECK_FAKE_SMI_READS"):
        with open(reads, "a") as f:
            f.write(f"{i} {k} {time.time():.4f}\n")
    return int(values[max(0, min(k, len(values) - 1))])
