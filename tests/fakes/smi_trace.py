"""The scripted trace the SMI stand-ins replay (shared by the amdsmi and pynvml stand-ins).

`TUNEDECK_FAKE_SMI_TRACE` names a JSON file: {"mode": "calls" | "time", "dt": s, "start": unix,
"devices": [{"name", "bdf", "total", "vram": [bytes, ...], "activity", "power", "temp",
"processes": [{"pid", "vram"}]}]}. "calls": each memory query returns the next value; "time": the
value at (now - start) / dt. Past the end the last value holds.
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
            _state.update(path=path, trace=json.load(f), calls={})
    return _state["trace"]


def devices() -> list[dict]:
    return load()["devices"]


def used(i: int) -> int:
    tr = load()
    values = tr["devices"][i]["vram"]
    if tr.get("mode") == "time":
        k = int((time.time() - tr.get("start", 0)) / tr.get("dt", 1.0))
    else:
        k = _state["calls"].get(i, 0)
        _state["calls"][i] = k + 1
    return int(values[max(0, min(k, len(values) - 1))])
