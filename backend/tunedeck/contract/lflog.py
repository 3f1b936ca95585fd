"""LLaMA-Factory's trainer_log.jsonl, read the same way by ingest and by the pure alert package.

METRICS is the one list of metric columns: each is a trainer_log.jsonl key (grad_norm: a
tunedeck_log.jsonl key, see tunedeck_train/lf_train.py), stored in a metric_points column of the same
name and answered under that name by the API. The other numbers of tunedeck_log.jsonl go into
`extra`, one JSON object per point.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from tunedeck.contract.strictjson import name

METRICS = (
    "loss",
    "eval_loss",
    "lr",
    "epoch",
    "throughput",
    "total_tokens",
    "vram_allocated",
    "vram_reserved",
    "grad_norm",
)
COUNTS = ("total_tokens",)  # integer columns; the others are floats
HMS = re.compile(r"^(?:(\d{1,9}) days?, )?(\d{1,9}):(\d\d):(\d\d)$")  # bounded: a float holds the sum


def seconds(text: Any) -> float | None:
    """LLaMA-Factory's "1 day, 0:01:23" durations in seconds."""
    m = HMS.match(str(text)) if text is not None else None
    if not m:
        return None
    d, h, mi, s = (int(g or 0) for g in m.groups())
    return float(((d * 24 + h) * 60 + mi) * 60 + s)


def _extra(text: str | None, step: Any) -> dict[str, float]:
    """The finite numbers of a tunedeck_log.jsonl line, when it is the same step's."""
    try:
        d = json.loads(text) if text else None
    except ValueError:
        return {}
    if not isinstance(d, dict) or d.get("step") != step:
        return {}
    return {
        str(k)[:100]: float(v)
        for k, v in list(d.items())[:100]
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    }


def parse_point(raw: str, extra: str | None = None) -> dict[str, Any]:
    """One trainer_log.jsonl line as metric columns; a line that is not JSON keeps only `raw`.
    `extra` is tunedeck_log.jsonl's line of the same event: grad_norm and the other numbers.

    Columns get finite numbers only: an Infinity or NaN (json.dumps writes them for a diverged
    loss) is None there and named in `nonfinite`, so no reader ever meets one."""
    try:
        d = json.loads(raw)
    except ValueError:
        d = None
    if not isinstance(d, dict):
        return {}
    more = _extra(extra, d.get("current_steps"))
    d = {**{k: v for k, v in more.items() if k in METRICS}, **d}
    rest = {k: v for k, v in more.items() if k not in METRICS}
    bad: dict[str, str] = {}

    def num(k: str) -> float | None:
        v = d.get(k)
        if not isinstance(v, (int, float)) or isinstance(v, bool):
            return None
        try:
            f = float(v)
        except OverflowError:  # an integer past any float
            f = math.inf if v > 0 else -math.inf
        if math.isfinite(f):
            return f
        if k in METRICS:
            bad[k] = name(f)
        return None

    def count(k: str) -> int | None:
        f = num(k)
        return int(f) if f is not None and 0 <= f < 2**62 else None  # SQLite integers are 64-bit

    out: dict[str, Any] = {k: count(k) if k in COUNTS else num(k) for k in METRICS}
    out["step"], out["total_steps"] = count("current_steps"), count("total_steps")
    out["percentage"] = num("percentage")
    out["eta_seconds"] = seconds(d.get("remaining_time"))
    out["nonfinite"] = json.dumps(bad) if bad else None
    out["extra"] = json.dumps(rest) if rest else None
    return out
