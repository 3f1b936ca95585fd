"""A minimal Server-Sent Events reader over httpx, for tests and benchmarks."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx


def events(response: httpx.Response) -> Iterator[dict]:
    """Yield {"event", "id", "data"} for each event of an open streaming response."""
    ev: dict = {}
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield {"event": ev.get("event", "message"), "id": ev.get("id"), "data": json.loads("\n".join(data))}
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
