"""Many rows in few statements: `INSERT ... VALUES (...), (...), ...` of up to CHUNK rows a statement.

The driver's executemany steps the statement once per row, and lets go of the GIL around each step:
a quarter more CPU per row than one statement binding a few hundred rows and stepping once. The
statement text depends on its row count, so the rows past the last full chunk go in statements of
power-of-two sizes: a handful of texts in the driver's statement cache, whatever the batch sizes.
"""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Sequence
from functools import lru_cache
from itertools import chain
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Connection

CHUNK = 512
# The most `?` a statement binds where Python cannot ask SQLite (getlimit is 3.11+): SQLite's
# limit before 3.32, the smallest any build has.
VARIABLES_FLOOR = 999


@lru_cache(maxsize=256)
def _sql(head: str, tail: str, width: int, n: int) -> str:
    one = f"({', '.join('?' * width)})"
    return f"{head} VALUES {', '.join([one] * n)} {tail}"


def _sizes(n: int, chunk: int) -> list[int]:
    full, rest = divmod(n, chunk)
    return [chunk] * full + [1 << b for b in range(rest.bit_length() - 1, -1, -1) if rest >> b & 1]


def _variables(conn: sqlite3.Connection) -> int:
    if sys.version_info >= (3, 11):
        return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    return VARIABLES_FLOOR


def driver_cursor(conn: Connection) -> sqlite3.Cursor:
    """A cursor of the driver's own connection under `conn`: plain tuples, no Row objects."""
    driver = conn.connection.driver_connection
    assert isinstance(driver, sqlite3.Connection), driver  # the store is SQLite
    return driver.cursor()


def insert(cur: sqlite3.Cursor, head: str, rows: Sequence[tuple], tail: str = "") -> None:
    """Run `head VALUES (row), ... tail` for `rows` (tuples of one width), CHUNK rows at most a statement.
    `head` and `tail` come from code (table and column names), never from a request."""
    if not rows:
        return
    width = len(rows[0])
    chunk = max(1, min(CHUNK, _variables(cur.connection) // width))
    at = 0
    for n in _sizes(len(rows), chunk):
        cur.execute(_sql(head, tail, width, n), list(chain.from_iterable(rows[at : at + n])))
        at += n
