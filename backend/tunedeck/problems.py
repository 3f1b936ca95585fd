"""The 422 shape every layer speaks: one detail item as FastAPI writes it, and the error that
carries a list of them from a check up to the route that answers."""

from __future__ import annotations

from typing import Any


class SpecError(Exception):
    """A spec that cannot run; `errors` are `{"loc": [...], "msg": str}` like FastAPI's own."""

    def __init__(self, errors: list[dict[str, Any]]):
        super().__init__("; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors))
        self.errors = errors


def detail(loc: list[Any], msg: str) -> dict[str, Any]:
    """One 422 detail item, FastAPI's shape."""
    return {"loc": loc, "msg": msg, "type": "value_error"}
