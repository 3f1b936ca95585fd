"""Databases from before the migration history became one line hold several Alembic heads: fold them into one.

The old history branched every migration off 0001 (0006 off 0002) and upgraded to all heads. The line keeps
the revision ids and orders them as they were written, so every set of heads an older tunedeck left behind
is, once its ancestors are added, a prefix of the line: the newest revision of it stands for all.
"""

from __future__ import annotations

from sqlalchemy import Connection, text

LINE = ("0001", "0005", "0003", "0002", "0004_ui", "0006")
OLD_PARENT = {"0001": None, "0005": "0001", "0003": "0001", "0002": "0001", "0004_ui": "0001", "0006": "0002"}


class LegacyHeadsError(RuntimeError):
    pass


def fold(heads: set[str]) -> str:
    """The one revision of the line that means what `heads` meant in the branched history."""
    unknown = heads - set(LINE)
    if unknown:
        raise LegacyHeadsError(f"alembic_version holds several rows, some unknown: {sorted(unknown)}")
    applied: set[str] = set()
    for head in heads:
        rev: str | None = head
        while rev is not None:
            applied.add(rev)
            rev = OLD_PARENT[rev]
    top = max(applied, key=LINE.index)
    missing = [r for r in LINE[: LINE.index(top)] if r not in applied]
    if missing:
        raise LegacyHeadsError(
            f"alembic_version rows {sorted(heads)} leave out {missing}, which the one-line "
            f"history applies before {top}; no tunedeck upgrade leaves such a set (was alembic "
            "run by hand?): restore a backup of the database"
        )
    return top


def fold_version_rows(conn: Connection, heads: tuple[str, ...]) -> None:
    """Replace several alembic_version rows by the one revision they amount to; one row or none stays as is."""
    if len(heads) > 1:
        top = fold(set(heads))
        conn.execute(text("DELETE FROM alembic_version"))
        conn.execute(text("INSERT INTO alembic_version (version_num) VALUES (:v)"), {"v": top})
