"""A minimal Server-Sent Events reader over httpx, for tests and benchmarks."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx


def strict(text: str) -> Any:
    """JSON as a browser's JSON.parse reads it: NaN and Infinity are errors (RFC 8259)."""

    def refuse(token: str) -> None:
        raise ValueError(f"not strict JSON: {token} in {text[:300]}")

    return json.loads(text, parse_constant=refuse)


def events(response: httpx.Response) -> Iterator[dict]:
    """Yield {"event", "id", "data"} for each event of an open streaming response; data is parsed
    strictly, as a browser would."""
    ev: dict = {}
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield {
                    "event": ev.get("event", "message"),
                    "id": ev.get("id"),
                    "data": strict("\n".join(data)),
                }
            ev, data = {}, []
        elif line.startswith(":"):
            continue  # keep-alive comment
        else:
            key, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if key == "data":
                data.append(value)
            else:
                ev[key] = value
