"""The database file's upkeep: a bounded WAL, freed pages given back to the disk, and what a day of
telemetry costs there.

- **The WAL.** SQLite's automatic checkpoint copies the WAL into the database but can rewind the WAL
  only at a moment no reader still reads an older snapshot. Team streams read in short transactions
  one after another, so with many viewers there is always one, and the WAL grows with everything
  written while they watch. When the WAL passes `wal_limit_bytes`, this worker asks for a TRUNCATE
  checkpoint: SQLite then holds new writers back until the readers in flight end (milliseconds),
  copies the rest and empties the file. It waits at most `CHECKPOINT_WAIT_S` for them (the ingest
  store process retries its write meanwhile) and tries again at the next pass if it could not.
  Every connection also sets `journal_size_limit` (store/db.py), so a WAL once emptied is cut back.
- **Freed pages.** Retention deletes raw samples, which frees pages inside the file but does not
  shrink it. A database created with `auto_vacuum=INCREMENTAL` (every new one: store/db.py) hands
  its free pages back in short steps here (`incremental_vacuum`, at most `VACUUM_STEP_S` a pass, so
  ingest never waits long). An older database says so in `/api/health`, and `tunedeck db vacuum`
  (with the server stopped) converts it.
- **A day on disk.** Every `storage_survey_s` a worker of its own (`StoreSurvey`) reads SQLite's own
  page accounting (the `dbstat` table: every page of the file, like the integrity check, and beside
  serving like it, at the lowest priorities) to
  learn what one stored memory sample and one metric point cost with their indexes and chart tiles,
  and multiplies by how many arrived in the last 24 h (found by bisecting the ids by time: a few
  index lookups). `/api/health` says it, with when it was measured.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.upkeep")

CHECKPOINT_WAIT_S = 2.0  # longest a checkpoint holds writers back waiting for readers
VACUUM_STEP_PAGES = 2048  # pages one incremental_vacuum statement gives back (8 MiB of 4 KiB pages)
VACUUM_STEP_S = 0.5  # a pass stops giving pages back after this long
VACUUM_MIN_FREE_PAGES = 256  # fewer free pages than this stay for SQLite to reuse
DAY_S = 86400.0
# What one memory sample costs on disk also covers its chart tiles (the pyramid is fed by samples).
SAMPLE_TABLES = ("memory_samples", "chart_tiles")
POINT_TABLES = ("metric_points",)


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def sizes(conn: sqlite3.Connection) -> dict[str, int]:
    """The file's pages in bytes: all of them, and the free ones (cheap: two header fields)."""
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    count = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    return {"db_bytes": page * count, "free_bytes": page * free}


def table_costs(conn: sqlite3.Connection) -> dict[str, dict[str, int]]:
    """Per table: its bytes with its indexes', and its rows (the cells of its leaf pages), from dbstat."""
    owner = dict(conn.execute("SELECT name, tbl_name FROM sqlite_master WHERE type IN ('table', 'index')"))
    out: dict[str, dict[str, int]] = {}
    rows = conn.execute(
        "SELECT name, sum(pgsize), sum(CASE WHEN pagetype = 'leaf' THEN ncell ELSE 0 END) FROM dbstat GROUP BY name"
    )
    for name, nbytes, cells in rows:
        table = owner.get(name, name)
        got = out.setdefault(table, {"bytes": 0, "rows": 0})
        got["bytes"] += int(nbytes or 0)
        if name == table:
            got["rows"] = int(cells or 0)
    return out


def rows_since(conn: sqlite3.Connection, table: str, since: float) -> int:
    """About how many rows of `table` (ids growing with arrival, a time column `t`) came at `since` or
    later: the first such id found by bisection over the id range, each step one primary-key lookup."""
    low, high = conn.execute(f"SELECT min(id), max(id) FROM {table}").fetchone()
    if high is None:
        return 0

    def t_at(i: int) -> float | None:
        row = conn.execute(f"SELECT t FROM {table} WHERE id >= ? ORDER BY id LIMIT 1", (i,)).fetchone()
        return row[0] if row else None

    if (t_at(high) or 0) < since:
        return 0
    while low < high:  # the first id whose row is at `since` or later
        mid = (low + high) // 2
        t = t_at(mid)
        if t is not None and t >= since:
            high = mid
        else:
            low = mid + 1
    (n,) = conn.execute(f"SELECT count(*) FROM {table} WHERE id >= ?", (low,)).fetchone()
    return int(n)


def day_cost(conn: sqlite3.Connection, *, now: float | None = None) -> dict[str, Any]:
    """What the last 24 h of telemetry take on disk: rows that arrived, times their measured cost."""
    costs = table_costs(conn)
    since = (now or time.time()) - DAY_S

    def per_row(owner: str, tables: tuple[str, ...]) -> float:
        rows = costs.get(owner, {}).get("rows", 0)
        return sum(costs.get(t, {}).get("bytes", 0) for t in tables) / rows if rows else 0.0

    sample_b, point_b = per_row("memory_samples", SAMPLE_TABLES), per_row("metric_points", POINT_TABLES)
    samples, points = rows_since(conn, "memory_samples", since), rows_since(conn, "metric_points", since)
    return {
        "memory_samples": samples,
        "metric_points": points,
        "bytes_per_sample": round(sample_b, 1),
        "bytes_per_point": round(point_b, 1),
        "bytes": int(samples * sample_b + points * point_b),
        "surveyed_at": time.time(),
    }


def checkpoint(db_path: Path, *, wait_s: float = CHECKPOINT_WAIT_S) -> dict[str, Any]:
    """A TRUNCATE checkpoint: the WAL copied in and emptied, or `busy` when readers or a writer held on."""
    before = file_size(Path(f"{db_path}-wal"))
    started = time.perf_counter()
    with closing(sqlite3.connect(db_path, timeout=wait_s, isolation_level=None)) as conn:
        busy, log_frames, copied = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    return {
        "at": time.time(),
        "busy": bool(busy),
        "wal_bytes_before": before,
        "wal_bytes_after": file_size(Path(f"{db_path}-wal")),
        "frames": log_frames,
        "copied": copied,
        "took_s": round(time.perf_counter() - started, 4),
    }


def give_back(conn: sqlite3.Connection, *, budget_s: float = VACUUM_STEP_S) -> int:
    """Free pages handed back to the disk in steps of VACUUM_STEP_PAGES until few are left or the
    budget is spent; the bytes given back (0 where the file does not vacuum incrementally)."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != 2:
        return 0
    page = conn.execute("PRAGMA page_size").fetchone()[0]
    deadline = time.perf_counter() + budget_s
    before = conn.execute("PRAGMA page_count").fetchone()[0]
    while time.perf_counter() < deadline:
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        if free < VACUUM_MIN_FREE_PAGES:
            break
        conn.execute(f"PRAGMA incremental_vacuum({min(free, VACUUM_STEP_PAGES)})").fetchall()
    return (before - conn.execute("PRAGMA page_count").fetchone()[0]) * page


class StoreSurvey(Worker):
    """Every `survey_s` (the first 5 minutes after the start at the latest), what a day of telemetry
    costs on disk (`day_cost`). It reads every page of the file: in a thread of its own at the lowest
    CPU and I/O priorities (Worker.background), so that serving comes first and the upkeep's
    checkpoints, which hold writers back while they run, keep theirs."""

    name = "store-survey"
    background = True

    def __init__(self, db_path: Path, *, survey_s: float):
        super().__init__()
        self.db_path = db_path
        self.delay_s, self.interval_s = min(300.0, survey_s), survey_s
        self.day: dict[str, Any] | None = None  # the last survey's

    def run_once(self) -> None:
        with closing(sqlite3.connect(self.db_path, timeout=CHECKPOINT_WAIT_S, isolation_level=None)) as conn:
            self.day = day_cost(conn)


class StoreUpkeep(Worker):
    """Checkpoints a WAL past its limit and gives free pages back; says the file's state with the
    last `StoreSurvey`'s day."""

    name = "store-upkeep"
    delay_s = 5.0

    def __init__(
        self,
        db_path: Path,
        *,
        wal_limit_bytes: int,
        survey: StoreSurvey | None = None,
        interval_s: float = 10.0,
    ):
        super().__init__()
        self.db_path, self.wal_limit_bytes, self.survey = db_path, wal_limit_bytes, survey
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last_checkpoint: dict[str, Any] | None = None
        self._checkpoints = 0
        self._given_back = 0

    def run_once(self) -> None:
        if file_size(Path(f"{self.db_path}-wal")) > self.wal_limit_bytes:
            done = checkpoint(self.db_path)
            with self._lock:
                self._last_checkpoint, self._checkpoints = done, self._checkpoints + 1
            if done["busy"]:
                log.info(
                    "WAL at %s bytes: its checkpoint met readers; the next pass tries again",
                    done["wal_bytes_before"],
                )
        with closing(sqlite3.connect(self.db_path, timeout=CHECKPOINT_WAIT_S, isolation_level=None)) as conn:
            try:
                given = give_back(conn)
            except sqlite3.OperationalError:  # busy: the next pass
                given = 0
        if given:
            with self._lock:
                self._given_back += given

    def said(self) -> dict[str, Any] | None:
        """For /api/health: the file's sizes now, the WAL's limit and last checkpoint, what was given
        back, and the last survey of a day's cost (None before the first); None when the file cannot
        be read (health says why from the storage faults, and must answer all the same)."""
        try:
            with closing(sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True, timeout=5)) as conn:
                now = sizes(conn)
                incremental = conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        except sqlite3.Error:
            return None
        with self._lock:
            return {
                "db_bytes": now["db_bytes"],
                "free_bytes": now["free_bytes"],
                "wal_bytes": file_size(Path(f"{self.db_path}-wal")),
                "wal_limit_bytes": self.wal_limit_bytes,
                "checkpoints": self._checkpoints,
                "last_checkpoint": self._last_checkpoint,
                "incremental_vacuum": incremental,
                "given_back_bytes": self._given_back,
                "day": self.survey.day if self.survey is not None else None,
            }
