"""How a refused request must read: a 422 whose FastAPI-style detail names the field and why."""

from __future__ import annotations

import httpx


def refused_at(r: httpx.Response, loc: list, kind: str) -> list[dict]:
    """The detail of `r`, checked: 422, an item at `loc` of type `kind`, and a message on every item."""
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert loc in [d["loc"] for d in detail], detail
    assert kind in {d["type"] for d in detail if d["loc"] == loc}, detail
    assert all(d["msg"] for d in detail)
    return detail
