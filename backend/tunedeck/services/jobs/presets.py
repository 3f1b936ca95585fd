"""Presets: the job YAMLs shipped in configs/ (read-only files) and those the team saves (rows).

A team preset's text is checked exactly as `POST /api/jobs/yaml` checks a submitted YAML (the same
parse, lint, reach and catalog checks against this node), so a preset that loads is one that would
be accepted; the 422 items are the submit's own, at the same keys.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from tunedeck.checks import spec as specs
from tunedeck.checks.presets import presets as shipped_files
from tunedeck.checks.submission import Node, resolve
from tunedeck.config import Settings
from tunedeck.problems import SpecError, detail
from tunedeck.services.errors import Conflict, Forbidden, NotFound
from tunedeck.store.tables import TeamPreset

SHIPPED = "shipped"
TEAM = "team"
# Text a YAML file can hold: tabs and line ends, no other control characters (YAML's reader
# refuses them too, but with an error about a "special character" the user never typed).
ALLOWED_CONTROLS = frozenset("\t\n\r")


def _text_problem(text: str) -> str | None:
    """Why `text` cannot be a preset's YAML: lone surrogates or control characters (None when fine)."""
    try:
        text.encode()
    except UnicodeEncodeError as e:
        return f"is not valid Unicode text (a lone surrogate at character {e.start})"
    for i, ch in enumerate(text):
        if ch not in ALLOWED_CONTROLS and unicodedata.category(ch) in ("Cc", "Cs"):
            return f"holds the control character U+{ord(ch):04X} at character {i}; a YAML file cannot"
    return None


def listing(session: Session) -> list[dict[str, Any]]:
    """Shipped presets first (job YAMLs and DeepSpeed JSONs, by file name), then the team's by name."""
    out: list[dict[str, Any]] = [
        {"name": k, "kind": p.suffix.lstrip("."), "source": SHIPPED, "owner": None, "description": ""}
        for k, p in shipped_files().items()
    ]
    rows = session.exec(select(TeamPreset).order_by(col(TeamPreset.name)))
    out += [_out(row) for row in rows]
    return out


def _out(row: TeamPreset, *, text: bool = False) -> dict[str, Any]:
    out = {
        "name": row.name,
        "kind": "yaml",
        "source": TEAM,
        "owner": row.owner,
        "description": row.description,
        "created_at": row.created_at,
    }
    if text:
        out["text"] = row.text
    return out


def read(session: Session, name: str) -> dict[str, Any]:
    """One preset with its text: a shipped file, else a team row."""
    path = shipped_files().get(name)
    if path is not None:
        kind = path.suffix.lstrip(".")
        return {
            "name": name,
            "kind": kind,
            "source": SHIPPED,
            "owner": None,
            "description": "",
            "text": path.read_text(),
        }
    row = session.exec(select(TeamPreset).where(TeamPreset.name == name)).first()
    if row is None:
        raise NotFound(f"no preset {name!r}")
    return _out(row, text=True)


def check(text: str, *, settings: Settings, node: Node) -> None:
    """Refuse `text` as `POST /api/jobs/yaml` would refuse it (SpecError), plus what no file can hold."""
    if (why := _text_problem(text)) is not None:
        raise SpecError([detail(["body", "text"], why)])
    spec = specs.spec_from_yaml(text, name="preset", max_items=settings.spec_max_keys)
    resolve(spec, settings, node).checked()


def save(
    session: Session,
    *,
    settings: Settings,
    node: Node,
    name: str,
    description: str,
    text: str,
    owner: str | None,
) -> dict[str, Any]:
    """Store a checked YAML under a new name (Conflict: a shipped preset's name, or a team one's)."""
    if name in shipped_files():
        raise Conflict(f"{name!r} is a preset shipped with tunedeck (read-only); choose another name")
    if (why := _text_problem(description)) is not None:
        raise SpecError([detail(["body", "description"], why)])
    check(text, settings=settings, node=node)
    if session.exec(select(TeamPreset).where(TeamPreset.name == name)).first() is not None:
        raise Conflict(f"a team preset named {name!r} exists; delete it first or choose another name")
    row = TeamPreset(name=name, owner=owner, description=description, text=text)
    session.add(row)
    try:
        session.commit()
    except IntegrityError:  # saved by someone else between the look and the insert
        session.rollback()
        raise Conflict(
            f"a team preset named {name!r} exists; delete it first or choose another name"
        ) from None
    session.refresh(row)
    return _out(row, text=True)


def delete(session: Session, *, name: str, may: Callable[[str | None], bool]) -> dict[str, Any]:
    """Remove a team preset; `may(owner)` says whether the caller may (its owner or an admin)."""
    if name in shipped_files():
        raise Conflict(f"{name!r} is a preset shipped with tunedeck (read-only); it cannot be deleted")
    row = session.exec(select(TeamPreset).where(TeamPreset.name == name)).first()
    if row is None:
        raise NotFound(f"no preset {name!r}")
    if not may(row.owner):
        raise Forbidden(f"only its owner ({row.owner or 'nobody'}) or an admin may delete preset {name!r}")
    out = _out(row)
    session.delete(row)
    session.commit()
    return out
