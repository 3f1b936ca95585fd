"""Strict JSON (RFC 8259) for everything the server sends: never a NaN or Infinity token.

Python's json writes them, LLaMA-Factory's trainer_log.jsonl holds them once a loss diverges, and
a browser's JSON.parse throws on them. A non-finite number goes out as null, and the object that
held it says what it was under `nonfinite`: {"loss": null, "nonfinite": {"loss": "inf"}}, so a
chart or an alert still sees that the loss became inf or NaN.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.responses import JSONResponse


def name(x: float) -> str:
    """ "nan", "inf" or "-inf": what `float()` reads back."""
    return "nan" if math.isnan(x) else "inf" if x > 0 else "-inf"


def clean(value: Any) -> Any:
    """The value with every non-finite float as None, each noted in its object's `nonfinite`."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        bad: dict[str, str] = {}
        for k, v in value.items():
            if isinstance(v, float) and not math.isfinite(v):
                out[k], bad[str(k)] = None, name(v)
            else:
                out[k] = clean(v)
        if bad:
            prior = out.get("nonfinite")
            out["nonfinite"] = {**prior, **bad} if isinstance(prior, dict) else bad
        return out
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    return value


def dumps(value: Any, **kw: Any) -> str:
    try:
        return json.dumps(value, allow_nan=False, **kw)
    except ValueError:  # a non-finite number somewhere: only then is the value walked
        return json.dumps(clean(value), allow_nan=False, **kw)


class StrictJSONResponse(JSONResponse):
    """The app's default response class: REST answers are strict JSON whatever a route returns."""

    def render(self, content: Any) -> bytes:
        return dumps(content, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
