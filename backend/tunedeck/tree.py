"""What a job config may hold: JSON's types only, text that can be written as UTF-8, and a bounded
number of keys and list items (lint and YAML parsing cost grows with it, and both are open to
anyone who may read)."""

from __future__ import annotations

from typing import Any

SCALARS = (str, int, float, bool, type(None))


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate such as "\ud800": no file or database can hold it
        return False
    return True


def _where(path: list[Any]) -> str:
    return ".".join(map(str, path)) or "(top level)"


def problems(value: Any, path: list[Any]) -> list[tuple[list[Any], str]]:
    """(location, reason) for every key or value that is not plain JSON text, numbers and structure."""
    out: list[tuple[list[Any], str]] = []
    stack = [(path, value)]
    while stack:
        at, v = stack.pop()
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, str):
                    out.append(
                        (
                            [*at, str(k)],
                            f"key {k!r} of {_where(at)} is a {type(k).__name__}, not a name: "
                            "keys must be text",
                        )
                    )
                elif not _encodable(k):
                    out.append((at, f"a key of {_where(at)} is not valid Unicode text (lone surrogate)"))
                else:
                    stack.append(([*at, k], item))
        elif isinstance(v, list):
            stack.extend(([*at, i], item) for i, item in enumerate(v))
        elif isinstance(v, str):
            if not _encodable(v):
                out.append((at, f"the value of {_where(at)} is not valid Unicode text (lone surrogate)"))
        elif isinstance(v, bytes):
            out.append((at, f"the value of {_where(at)} is binary (YAML !!binary); give it as text"))
        elif not isinstance(v, SCALARS):
            why = (
                f"the value of {_where(at)} is a {type(v).__name__} (a YAML tag JSON cannot carry); quote it"
            )
            out.append((at, why))
    return out


def count(value: Any) -> int:
    """Keys and list items, nested ones included."""
    n, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            n += len(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            n += len(v)
            stack.extend(v)
    return n
