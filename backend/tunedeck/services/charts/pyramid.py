"""Chart tiles: each series' min, max, first and last point over x-aligned tiles 4**k units wide.

Every stored metric point (x = step) and memory sample (x = unix time) lands in one tile of each
level k = FINEST..LEVELS. Ingest tiles the rows stored since a watermark of row ids (`catch_up`, in the
writer's transaction; the memory samples from the columns the writer just inserted, not read back),
so a chart read of any window picks the finest level whose tiles in the window fit and reads
O(max_points) rows. Each batch upserts the finest tiles it touches; a series' newest finest tile
stays open (`chart_open`) and goes up into the coarser levels once, when a later tile opens (or
retention settles the job), so a 1 Hz series writes its coarse levels every 4**FINEST seconds, not
every second. Readers merge the open tile into the coarse tiles they read. A tile's min and max are real
points (x, y and an aux value: the row id of a memory sample, the time of a metric point), so a
spike drawn from tiles is the sample itself. Retention drops raw samples and fine levels but keeps
the coarse ones, so old runs are still drawn from them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike
from sqlalchemy import Connection, Engine
from sqlalchemy.exc import OperationalError

from tunedeck.contract.lflog import METRICS
from tunedeck.store import bulk

log = logging.getLogger("tunedeck.pyramid")

LEVELS = 12  # 4**12 s is 194 days of samples, 4**12 steps 16.7M steps: one or two tiles at the top
# Tiles of 4 points would be three quarters of all tiles (as many bytes as the raw rows); windows that
# fine read the raw rows instead (at most RAW_READ x max_points of them) and bucket them in memory.
FINEST = 2
RAW_READ = 4
FIELDS = ("n", *(f"{c}_{p}" for p in ("min", "max", "first", "last") for c in "xya"))
N, XMIN, YMIN, AMIN, XMAX, YMAX, AMAX, XFIRST, YFIRST, AFIRST, XLAST, YLAST, ALAST = range(13)
METRIC_COLUMNS = tuple(
    k for k in METRICS if k != "epoch"
)  # the curves by step; total_tokens for a tokens axis
ROWS = "metric.rows"  # every metric row with a step (y = its id): counts and the newest id
CHUNK = 100_000  # rows tiled per pass, so a backfill holds bounded memory

# When an incoming tile's point wins over the stored one (ties as in `reduce`).
_WINS = {
    "min": "excluded.y_min < y_min OR (excluded.y_min = y_min AND excluded.x_min < x_min)",
    "max": "excluded.y_max > y_max OR (excluded.y_max = y_max AND excluded.x_max >= x_max)",
    "first": "excluded.x_first < x_first OR (excluded.x_first = x_first AND excluded.y_first < y_first)",
    "last": "excluded.x_last > x_last OR (excluded.x_last = x_last AND excluded.y_last >= y_last)",
}
_KEPT = {"min": "y", "max": "y", "first": "x", "last": "x"}  # the column min() / max() can merge
INTO_TILES = f"INSERT INTO chart_tiles (job_id, series, level, tile, {', '.join(FIELDS)})"
MERGE = "ON CONFLICT (job_id, series, level, tile) DO UPDATE SET n = n + excluded.n, " + ", ".join(
    f"{c}_{p} = "
    + (
        f"{'min' if p in ('min', 'first') else 'max'}({c}_{p}, excluded.{c}_{p})"
        if c == _KEPT[p]
        else f"CASE WHEN {_WINS[p]} THEN excluded.{c}_{p} ELSE {c}_{p} END"
    )
    for p in _WINS
    for c in "xya"
)  # every right-hand side reads the stored row as it was before this update


# ------------------------------------------------------------------ merging
def points(x: np.ndarray, y: np.ndarray, a: np.ndarray) -> np.ndarray:
    """Single points as stats rows (n = 1; min, max, first and last all the point itself)."""
    p = np.column_stack((x, y, a)).astype(np.float64)
    return np.column_stack((np.ones(len(p)), p, p, p, p))


def reduce(
    keys: list[np.ndarray], s: np.ndarray, *, single: bool = False
) -> tuple[list[np.ndarray], np.ndarray]:
    """Stats rows with equal keys (first key primary) merged: min by (y, x) the smallest, max by (y, x)
    the largest, first by (x, y) the smallest, last the largest. `single`: the rows are single points
    (two sorts do). Returns the groups' keys, in key order, and their rows."""
    if not len(s):
        return keys, s
    rev = tuple(reversed(keys))
    o_min = np.lexsort((s[:, XMIN], s[:, YMIN], *rev))
    sk = [k[o_min] for k in keys]
    change = np.zeros(len(s), dtype=bool)
    change[0] = True
    for k in sk:
        change[1:] |= k[1:] != k[:-1]
    starts = np.flatnonzero(change)
    ends = np.r_[starts[1:], len(s)] - 1
    out = np.empty((len(starts), len(FIELDS)))
    out[:, N] = np.add.reduceat(s[o_min, N], starts)
    out[:, XMIN : AMIN + 1] = s[o_min[starts], XMIN : AMIN + 1]
    o_max = o_min if single else np.lexsort((s[:, XMAX], s[:, YMAX], *rev))
    out[:, XMAX : AMAX + 1] = s[o_max[ends], XMAX : AMAX + 1]
    o = np.lexsort((s[:, YFIRST], s[:, XFIRST], *rev))
    out[:, XFIRST : AFIRST + 1] = s[o[starts], XFIRST : AFIRST + 1]
    o = o if single else np.lexsort((s[:, YLAST], s[:, XLAST], *rev))
    out[:, XLAST : ALAST + 1] = s[o[ends], XLAST : ALAST + 1]
    return [k[starts] for k in sk], out


def merged(s) -> np.ndarray | None:
    """All rows as one (None when there are none)."""
    if not len(s):
        return None
    if len(s) > 32:
        return reduce([np.zeros(len(s))], np.asarray(s))[1][0]
    rows = [
        r.tolist() if isinstance(r, np.ndarray) else list(r) for r in s
    ]  # few rows: plain Python is faster
    out = [sum(r[N] for r in rows)]
    for lo, pick in ((XMIN, min), (XMAX, max), (XFIRST, min), (XLAST, max)):
        ax, ay = (1, 0) if lo in (XMIN, XMAX) else (0, 1)  # compare by (y, x) or by (x, y)
        best = pick(rows, key=lambda r: (r[lo + ax], r[lo + ay]))  # noqa: B023
        out += best[lo : lo + 3]
    return np.array(out)


def distinct(pts: np.ndarray) -> np.ndarray:
    """(x, y, a) rows sorted by x, y, a, each once."""
    pts = pts[np.lexsort((pts[:, 2], pts[:, 1], pts[:, 0]))]
    keep = np.ones(len(pts), dtype=bool)
    keep[1:] = (pts[1:] != pts[:-1]).any(axis=1)
    return pts[keep]


def tiles_of(x: ArrayLike, level: int) -> np.ndarray:
    # Widths are powers of two, so floor(x / 4**k) == floor(floor(x / 4**(k-1)) / 4) exactly.
    return np.floor(np.asarray(x, dtype=np.float64) / 4.0**level)


# ------------------------------------------------------------------ ingest
NODE_CODE = 2_000_000  # a memory series' number: node code * NODE_CODE + gpu + 1 (gpu -1 is host memory)


def memory_key(node: str, gpu: int, reading: str = "memory") -> str:
    """A memory series' tiles: `memory.<gpu>` on a job's one unnamed node (rows from before nodes were
    named keep their tiles), `memory.<node>/<gpu>` otherwise; a reading's beside it (`util.<gpu>`)."""
    return f"{reading}.{node}/{gpu}" if node else f"{reading}.{gpu}"


# What a sample's tiles keep besides its bytes (series prefix -> sample column), so a chart read from
# tiles alone (downsampled, or raw samples pruned) still has utilisation and temperatures: the edge
# sensor, and the junction for parts without one (MI300-series).
READINGS = {"util": "util", "temp": "temp_c", "junction": "temp_junction_c"}
KINDS = ("memory", *READINGS)  # a sample series' kind: its number's digit above the node codes
KIND_CODE = 1_000 * NODE_CODE


def _sample_series(
    job: np.ndarray, dev: np.ndarray, t: np.ndarray, used: np.ndarray, ids: np.ndarray, cols: dict[str, Any]
) -> tuple[np.ndarray, ...]:
    """(job, series, t, y, id) of the bytes and of each reading present (NULL readings skipped)."""
    parts = [(job, dev, t, used, ids)]
    for k, name in enumerate(READINGS.values(), start=1):
        v = cols.get(name)
        if v is None:
            continue
        y = np.asarray(v, dtype=np.float64)  # None -> NaN
        keep = ~np.isnan(y)
        if keep.any():
            parts.append((job[keep], dev[keep] + k * KIND_CODE, t[keep], y[keep], ids[keep]))
    return tuple(np.concatenate(c) for c in zip(*parts))


def _sample_key(names: list[str]) -> Key:
    def key(v: float) -> str:
        kind, rest = divmod(int(v), KIND_CODE)
        c, g = divmod(rest, NODE_CODE)
        return memory_key(names[c], g - 1, KINDS[kind])

    return key


def metric_key(name: str) -> str:
    return f"metric.{name}"


Key = Callable[[float], str]


def _metric_name(sid: float) -> str:
    return ROWS if sid == 0 else metric_key(METRIC_COLUMNS[int(sid) - 1])


@dataclass(frozen=True)
class Source:
    """A raw table the pyramid follows: its rows after a watermark id, as (job, series, x, y, a) and
    the series' keys by number."""

    name: str
    table: str
    columns: str

    def series(
        self, rows: list[tuple]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, Key]:
        if self.name == "memory":  # id, job_id, gpu, t, used_bytes, node, then the READINGS
            ids, job, gpu, t, used, nodes, *readings = zip(*rows)
            names = sorted(set(nodes))  # few per chunk: the job's nodes
            if len(names) == 1:
                code = np.zeros(len(rows))
            else:
                code = np.fromiter(map({n: i for i, n in enumerate(names)}.__getitem__, nodes), np.float64)
            sid = code * NODE_CODE + np.array(gpu, dtype=np.float64) + 1
            f = np.float64
            cols = dict(zip(READINGS.values(), readings))
            arrays = (np.array(job, f), sid, np.array(t, f), np.array(used, f), np.array(ids, f))
            return (*_sample_series(*arrays, cols), _sample_key(names))  # type: ignore[return-value]
        arr = np.array(rows, dtype=np.float64)  # NULL -> NaN
        row_ids, jobs = arr[:, 0], arr[:, 1]
        # id, job_id, step, t, metric columns...: series 0 is the rows themselves (y = id)
        parts = []
        for i, y in enumerate((row_ids, *arr[:, 4:].T)):
            keep = ~np.isnan(arr[:, 2]) & ~np.isnan(y)
            parts.append((jobs[keep], np.full(keep.sum(), i), arr[keep, 2], y[keep], arr[keep, 3]))
        # (mypy counts a starred generator's items as unknown: five arrays, then the key)
        return (*(np.concatenate(c) for c in zip(*parts)), _metric_name)  # type: ignore[return-value]


SOURCES = (
    Source(
        "memory", "memory_samples", f"id, job_id, gpu, t, used_bytes, node, {', '.join(READINGS.values())}"
    ),
    Source("metrics", "metric_points", f"id, job_id, step, t, {', '.join(METRIC_COLUMNS)}"),
)


def _rows(
    job: np.ndarray, names: list[str], level: np.ndarray | int, tile: np.ndarray, s: np.ndarray
) -> list:
    """Upsert rows of stats rows `s` (job ids, series names and tiles beside them)."""
    n = len(s)
    lv = np.broadcast_to(np.asarray(level, dtype=np.float64), (n,))
    return list(
        zip(
            job.astype(np.int64).tolist(),
            names,
            lv.astype(np.int64).tolist(),
            tile.astype(np.int64).tolist(),
            s[:, N].astype(np.int64).tolist(),
            *s[:, 1:].T.tolist(),
        )
    )


def _coarse(cur, job: np.ndarray, names: list[str], tile: np.ndarray, s: np.ndarray) -> None:
    """Fold finest-level stats rows into every coarser level: one merge, one upsert per touched tile."""
    if not len(s):
        return
    codes = {name: i for i, name in enumerate(dict.fromkeys(names))}
    sid = np.fromiter(map(codes.__getitem__, names), np.float64, len(names))
    up = LEVELS - FINEST
    level = np.repeat(np.arange(FINEST + 1.0, LEVELS + 1), len(s))
    coarse = np.concatenate([np.floor_divide(tile, 4.0**k) for k in range(1, up + 1)])
    (level, job, sid, coarse), rows = reduce(
        [level, np.tile(job, up), np.tile(sid, up), coarse], np.tile(s, (up, 1))
    )
    by_code = list(codes)
    bulk.insert(cur, INTO_TILES, _rows(job, [by_code[int(v)] for v in sid], level, coarse, rows), MERGE)


OPEN_SQL = "SELECT job_id, series, tile FROM chart_open WHERE job_id IN ({})"
INTO_OPEN = "INSERT INTO chart_open (job_id, series, tile)"
MOVE_OPEN = "ON CONFLICT (job_id, series) DO UPDATE SET tile = excluded.tile"
FINEST_ROW = (
    f"SELECT job_id, series, tile, {', '.join(FIELDS)} FROM chart_tiles "
    f"WHERE job_id = ? AND series = ? AND level = {FINEST} AND tile = ?"
)


def _finest(cur, keys: list[tuple[int, str, int]]) -> list[tuple]:
    """The finest-level rows (job, series, tile, stats...) of these tiles: one primary-key lookup each
    (a series' open tile closes every 4**FINEST seconds, so a 1 Hz batch brings a few)."""
    return [row for k in keys for row in cur.execute(FINEST_ROW, k).fetchall()]


def _columns(rows: list[tuple]) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """`_finest` rows as `_coarse` takes them: job ids, series names, tiles and stats rows."""
    f = np.float64
    stats = np.array([r[3:] for r in rows], f).reshape(len(rows), len(FIELDS))
    return np.array([r[0] for r in rows], f), [r[1] for r in rows], np.array([r[2] for r in rows], f), stats


def add(cur, key: Key, job: np.ndarray, sid: np.ndarray, x, y, a) -> None:
    """Fold points into the finest tiles (one upsert per touched tile), and into the coarser levels
    those of them that are not their series' open tile: a late point's tile, and the open tile a
    newer one closes (read back whole). The newest tile each series touched is its open tile now."""
    (job, sid, tile), s = reduce([job, sid, tiles_of(x, FINEST)], points(x, y, a), single=True)
    named = {v: key(v) for v in set(sid.tolist())}  # (a few series, many tiles each)
    names = [named[v] for v in sid.tolist()]
    bulk.insert(cur, INTO_TILES, _rows(job, names, FINEST, tile, s), MERGE)
    jobs, tiles = job.astype(np.int64).tolist(), tile.astype(np.int64).tolist()
    known = {
        (j, ser): t
        for j, ser, t in cur.execute(
            OPEN_SQL.format(", ".join("?" * len(set(jobs)))), sorted(set(jobs))
        ).fetchall()
    }
    # Rows come sorted by (job, series, tile): each series' last row holds its newest tile.
    last = {(j, ser): i for i, (j, ser) in enumerate(zip(jobs, names))}
    fresh = [i for (j, ser), i in last.items() if (j, ser) not in known]
    if fresh:  # a series with no open tile: its newest tile is open only if this batch began it
        had = {
            (r[0], r[1], r[2]): r[3 + N] for r in _finest(cur, [(jobs[i], names[i], tiles[i]) for i in fresh])
        }
        for i in fresh:
            if had.get((jobs[i], names[i], tiles[i])) == int(s[i, N]):
                known[(jobs[i], names[i])] = None  # (no tile before this batch's)
    direct, fold, moved = [], [], []
    for i, (j, ser, t) in enumerate(zip(jobs, names, tiles)):
        k = (j, ser)
        if k not in known:  # older points in the newest tile: everything goes up now (after an upgrade)
            direct.append(i)
            continue
        was = known[k]
        top = tiles[last[k]] if was is None else max(tiles[last[k]], was)
        if t != top and t != was:  # a late point, or a tile this batch both began and passed
            direct.append(i)
        if i == last[k] and top != was:  # a newer tile opens: the open one (read back whole) goes up
            moved.append((j, ser, top))
            if was is not None:
                fold.append((j, ser, was))
    f_job, f_names, f_tile, f_stats = _columns(_finest(cur, fold))
    pick = np.asarray(direct, dtype=np.int64)
    _coarse(
        cur,
        np.concatenate((job[pick], f_job)),
        [names[i] for i in direct] + f_names,
        np.concatenate((tile[pick], f_tile)),
        np.vstack((s[pick], f_stats)),
    )
    bulk.insert(cur, INTO_OPEN, moved, MOVE_OPEN)


def settle(cur, job_ids: list[int]) -> None:
    """Fold these jobs' open tiles into the coarser levels (before retention drops the finest ones)."""
    if not job_ids:
        return
    marks = ", ".join("?" * len(job_ids))
    keys = [tuple(r) for r in cur.execute(OPEN_SQL.format(marks), job_ids).fetchall()]
    _coarse(cur, *_columns(_finest(cur, keys)))
    cur.execute(f"DELETE FROM chart_open WHERE job_id IN ({marks})", job_ids)


def newest_sample(conn: Connection) -> int:
    """The newest memory sample's id (0: none): taken before a transaction's inserts, it lets
    `catch_up` tell that the rows after it are exactly the samples the transaction handed over."""
    conn.exec_driver_sql("UPDATE chart_state SET through_id = through_id")  # the write lock first
    return conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM memory_samples").scalar_one()


@dataclass
class Fresh:
    """Memory samples a transaction inserted, as its batches' columns in insert order, and the newest
    id before them: tiled from memory when the table shows every one of them stored (no resend)."""

    before: int
    # (job id, node, columns) of each batch
    batches: list[tuple[int, str, dict[str, list]]] = field(default_factory=list)
    top: int | None = None  # the newest id once `seal` found the rows after `before` exactly these

    def add(self, job_id: int, columns: dict[str, list], node: str = "") -> None:
        if columns.get("line"):
            self.batches.append((job_id, node, columns))

    def seal(self, conn: Connection) -> None:
        """After the inserts, in their transaction: whether every sample handed over was stored (no
        resend skipped), so that others may take the columns for the rows (`top` set) or not (None)."""
        n = sum(len(c["line"]) for _, _, c in self.batches)
        top = conn.exec_driver_sql("SELECT coalesce(max(id), 0) FROM memory_samples").scalar_one()
        self.top = top if n and top - self.before == n else None

    def points(self, cur, through: int) -> tuple | None:
        """(key, job, series, t, used, id) of the rows after `through`, as `Source.series` gives them,
        or None when they are not exactly these samples (rows before `before` untiled, or a resent
        sample skipped by the insert)."""
        top = self.top
        if top is None or through != self.before:
            return None
        # SQLite gives a new row the largest id + 1, and this transaction is the only writer: the
        # samples hold ids before + 1 ... before + n, in insert order.
        f = np.float64
        names = sorted({node for _, node, _ in self.batches})
        code = {name: i for i, name in enumerate(names)}
        job, sid, t, used = (
            np.concatenate(parts)
            for parts in zip(
                *(
                    (
                        np.full(len(c["line"]), j, dtype=f),
                        code[node] * NODE_CODE + np.asarray(c["gpu"], dtype=f) + 1,
                        np.asarray(c["t"], dtype=f),
                        np.asarray(c["used_bytes"], dtype=f),
                    )
                    for j, node, c in self.batches
                )
            )
        )
        # Each reading as one column over the batches (NaN where a batch or a sample has none).
        cols = {
            name: np.concatenate(
                [
                    np.asarray(c[name] if name in c else [None] * len(c["line"]), dtype=f)
                    for _, _, c in self.batches
                ]
            )
            for name in READINGS.values()
            if any(name in c for _, _, c in self.batches)
        }
        ids = np.arange(through + 1.0, top + 1.0)
        job, sid, t, used, ids = _sample_series(job, sid, t, used, ids, cols)
        return _sample_key(names), job, sid, t, used, ids


def catch_up(conn: Connection, fresh: Fresh | None = None) -> int:
    """Tile every metric and memory row stored since the last call (in the caller's transaction);
    returns how many rows it tiled. `fresh`: the memory samples this transaction stored, tiled
    from the caller's columns instead of read back when they are exactly the new rows."""
    cur = conn.connection.cursor()  # the DBAPI cursor: no Row object per sample
    try:
        # Take the write lock before reading the watermark: two tilers never fold the same rows.
        cur.execute("UPDATE chart_state SET through_id = through_id")
        seen = 0
        for src in SOURCES:
            (through,) = cur.execute(
                "SELECT through_id FROM chart_state WHERE source = ?", (src.name,)
            ).fetchone()
            known = fresh.points(cur, through) if fresh is not None and src.name == "memory" else None
            if known is not None:
                add(cur, *known)
                top = int(known[5].max())  # the samples' ids are through + 1 ... top (readings repeat them)
                through, seen = top, seen + top - through
            while rows := cur.execute(
                f"SELECT {src.columns} FROM {src.table} WHERE id > ? ORDER BY id LIMIT {CHUNK}", (through,)
            ).fetchall():
                *cols, key = src.series(rows)
                add(cur, key, *cols)
                through, seen = int(rows[-1][0]), seen + len(rows)
            cur.execute("UPDATE chart_state SET through_id = ? WHERE source = ?", (through, src.name))
        return seen
    finally:
        cur.close()


def lagging(cur) -> bool:
    """Rows stored that no tile holds yet (written by another path, or before the pyramid existed)."""
    for src in SOURCES:
        (through,) = cur.execute(
            "SELECT through_id FROM chart_state WHERE source = ?", (src.name,)
        ).fetchone()
        (top,) = cur.execute(f"SELECT max(id) FROM {src.table}").fetchone()
        if top is not None and top > through:
            return True
    return False


def current(engine: Engine) -> None:
    """Tile what ingest has not (a database from before the pyramid, rows written by hand) before a read."""
    raw = engine.raw_connection()
    try:
        behind = lagging(raw.cursor())
    finally:
        raw.close()
    if behind:
        try:
            with engine.begin() as conn:
                n = catch_up(conn)
            log.info("charts: tiled %d stored rows", n)
        except OperationalError as e:  # a read-only database still draws what its tiles hold
            log.warning("charts: cannot tile stored rows: %s", e)


# ------------------------------------------------------------------ reading
@dataclass
class Series:
    """One series to read: its tiles' key and its raw points as (x, y, a) between two x values."""

    key: str
    raw_sql: str  # ends in "x >= ? AND x <= ?"; ordered by x
    params: tuple
    floor: int = 0  # the finest level held: 0 = every raw point is there; k = retention kept levels >= k
    scan: int | None = None  # rows a raw read of the window would walk, when more than its points


@dataclass
class Answer:
    n: int  # points in the window
    level: int  # 0: the raw points themselves
    x: np.ndarray
    y: np.ndarray
    a: np.ndarray
    tile: np.ndarray = field(default_factory=lambda: np.empty(0))  # per tile read: its index ...
    group: np.ndarray = field(default_factory=lambda: np.empty(0))  # ... and the bucket it went to
    buckets: np.ndarray = field(default_factory=lambda: np.empty((0, len(FIELDS))))

    @property
    def reduced(self) -> bool:
        return len(self.x) < self.n


EMPTY = np.empty(0)
SELECT_TILES = (
    f"SELECT tile, {', '.join(FIELDS)} FROM chart_tiles WHERE job_id = ? AND series = ? AND level = ? "
    "AND tile >= ? AND tile <= ? ORDER BY tile"
)


SELECT_OPEN = (
    f"SELECT t.tile, {', '.join('t.' + f for f in FIELDS)} FROM chart_open o JOIN chart_tiles t "
    f"ON t.job_id = o.job_id AND t.series = o.series AND t.level = {FINEST} AND t.tile = o.tile "
    "WHERE o.job_id = ? AND o.series = ?"
)


class Reader:
    """Window reads over one DBAPI cursor (the caller holds one read transaction: one snapshot)."""

    def __init__(self, cur, job_id: int):
        self.cur, self.job_id = cur, job_id
        self._open: dict[str, tuple[float, np.ndarray] | None] = {}

    def open_tile(self, s: Series) -> tuple[float, np.ndarray] | None:
        """The series' open finest tile (not in the coarser levels yet) and its row, if it has one."""
        if s.key not in self._open:
            row = self.cur.execute(SELECT_OPEN, (self.job_id, s.key)).fetchone()
            self._open[s.key] = None if row is None else (float(row[0]), np.array(row[1:], dtype=np.float64))
        return self._open[s.key]

    def open_at(self, s: Series, level: int) -> tuple[float, np.ndarray] | None:
        """The tile of `level` (coarser than the finest) that the series' open tile belongs to, and its row."""
        held = self.open_tile(s) if level > FINEST else None
        return None if held is None else (float(np.floor_divide(held[0], 4.0 ** (level - FINEST))), held[1])

    def tiles(self, s: Series, level: int, t0: float, t1: float) -> tuple[np.ndarray, np.ndarray]:
        rows = self.cur.execute(SELECT_TILES, (self.job_id, s.key, level, t0, t1)).fetchall()
        arr = np.array(rows, dtype=np.float64).reshape(len(rows), 1 + len(FIELDS))
        tiles, stats = arr[:, 0], arr[:, 1:]
        held = self.open_at(s, level)
        if held is not None and t0 <= held[0] <= t1:  # the open tile's points belong to this tile too
            at, row = held
            i = int(np.searchsorted(tiles, at))
            if i < len(tiles) and tiles[i] == at:
                stats[i] = merged(np.vstack((stats[i], row)))
            else:
                tiles, stats = np.insert(tiles, i, at), np.insert(stats, i, row, axis=0)
        return tiles, stats

    def raw(self, s: Series, lo: float, hi: float) -> np.ndarray:
        rows = self.cur.execute(s.raw_sql, (*s.params, lo, hi)).fetchall()
        arr = np.array(rows, dtype=np.float64).reshape(len(rows), 3)
        return points(arr[:, 0], arr[:, 1], arr[:, 2])

    def part(self, s: Series, level: int, tile: float, row: np.ndarray, x0: float, x1: float):
        """The points of one tile that lie in [x0, x1], as one row (None if none): finer tiles, then
        raw points, where the tile crosses the window's edge; the whole tile where finer data is gone."""
        if level <= s.floor:
            return row
        w = 4.0**level
        lo, hi = max(x0, tile * w), min(x1, (tile + 1) * w)
        if level == FINEST:
            p = self.raw(s, lo, hi)
            return merged(p[tiles_of(p[:, XMIN], level) == tile])
        kids, rows = self.tiles(s, level - 1, tile * 4, tile * 4 + 3)
        kept = [
            r if r[XFIRST] >= x0 and r[XLAST] <= x1 else self.part(s, level - 1, k, r, x0, x1)
            for k, r in zip(kids, rows)
            if r[XLAST] >= x0 and r[XFIRST] <= x1
        ]
        kept = [r for r in kept if r is not None]
        return merged(np.array(kept)) if kept else None

    def span(self, s: Series, level: int, x0: float, x1: float) -> tuple[np.ndarray, np.ndarray]:
        """Tiles of `level` in [x0, x1], the two at the edges cut to the window."""
        tiles, rows = self.tiles(s, level, *tiles_of([x0, x1], level))
        keep = np.ones(len(rows), dtype=bool)
        for i in {0, len(rows) - 1} if len(rows) else ():
            r = rows[i]
            if not (r[XFIRST] >= x0 and r[XLAST] <= x1):
                cut = self.part(s, level, tiles[i], r, x0, x1)
                if cut is None:
                    keep[i] = False
                else:
                    rows[i] = cut
        return tiles[keep], rows[keep]

    def extent(self, s: Series) -> np.ndarray | None:
        """The whole series as one row, from its top level."""
        return merged(self.tiles(s, LEVELS, -(2.0**62), 2.0**62)[1])

    def clamp(self, s: Series, x0: float | None, x1: float | None) -> tuple[float, float] | None:
        """The window cut to the series' extent (None when they do not meet)."""
        ext = self.extent(s)
        if ext is None:
            return None
        x0 = ext[XFIRST] if x0 is None else max(x0, ext[XFIRST])
        x1 = ext[XLAST] if x1 is None else min(x1, ext[XLAST])
        return (x0, x1) if x0 <= x1 else None

    def total(self, s: Series, x0: float | None, x1: float | None) -> int:
        """How many points of the series lie in [x0, x1] (from at most 64 tiles and the edges' finer ones)."""
        if (w := self.clamp(s, x0, x1)) is None:
            return 0
        rows = self.span(s, self.level(s, *w, 64), *w)[1]
        return int(rows[:, N].sum())

    def count(self, s: Series, level: int, x0: float, x1: float, most: int) -> int:
        t0, t1 = tiles_of([x0, x1], level)
        held = self.open_at(s, level)
        # (the open tile may lie in a tile no stored row holds yet: counted as one more, at most)
        extra = int(held is not None and t0 <= held[0] <= t1)
        return (
            extra
            + self.cur.execute(
                "SELECT count(*) FROM (SELECT 1 FROM chart_tiles WHERE job_id = ? AND series = ? AND level = ? "
                "AND tile >= ? AND tile <= ? LIMIT ?)",
                (self.job_id, s.key, level, t0, t1, most + 1),
            ).fetchone()[0]
        )

    def level(self, s: Series, x0: float, x1: float, most: int) -> int:
        """The finest level with at most `most` tiles in the window (counting at most most + 1 rows)."""
        lo = max(FINEST, s.floor)
        hi = next((k for k in range(lo, LEVELS + 1) if np.diff(tiles_of([x0, x1], k))[0] + 1 <= most), LEVELS)
        # Coarser levels never hold more tiles: walk down from the finest level that surely fits, one
        # bounded count a level (dense series stop after one).
        while hi > lo and self.count(s, hi - 1, x0, x1, most) <= most:
            hi -= 1
        return hi

    def window(self, s: Series, x0: float | None, x1: float | None, max_points: int) -> Answer:
        """At most about `max_points` points of the series in [x0, x1]: all of them when that many fit,
        else per bucket of tiles its min and max (and the window's first and last point)."""
        if (w := self.clamp(s, x0, x1)) is None:
            return Answer(0, 0, EMPTY, EMPTY, EMPTY)
        x0, x1 = w
        budget = max(1, (max_points - 2) // 2)  # two points a bucket, and the window's ends
        # Up to 4x the buckets in tiles of the finest level that fits, merged into `budget` runs of
        # neighbours: at least `budget` buckets whatever the window, never more.
        level = self.level(s, x0, x1, 4 * budget)
        tiles, rows = self.span(s, level, x0, x1)
        n = int(rows[:, N].sum())
        if not n:
            return Answer(0, 0, EMPTY, EMPTY, EMPTY)
        scan = n if s.scan is None else s.scan
        if s.floor == 0 and (n <= max_points or (level == FINEST and scan <= RAW_READ * max_points)):
            p = self.raw(s, x0, x1)  # every point fits, or finer tiles than these would be needed
            return downsample(p[:, XMIN], p[:, YMIN], p[:, AMIN], max_points)
        group = (np.arange(len(rows)) * min(budget, len(rows))) // max(1, len(rows))
        _, buckets = reduce([group], rows)
        first, last = buckets[0], buckets[-1]
        pts = np.vstack(
            (
                first[XFIRST : AFIRST + 1],
                buckets[:, XMIN : AMIN + 1],
                buckets[:, XMAX : AMAX + 1],
                last[XLAST : ALAST + 1],
            )
        )
        pts = distinct(pts)
        return Answer(n, level, pts[:, 0], pts[:, 1], pts[:, 2], tiles, group, buckets)


def downsample(x: np.ndarray, y: np.ndarray, a: np.ndarray, max_points: int) -> Answer:
    """The same answer computed from points in memory (for reads the tiles cannot serve)."""
    n = len(x)
    if n <= max_points:
        o = np.lexsort((a, x))
        return Answer(n, 0, x[o], y[o], a[o])
    budget = max(1, (max_points - 2) // 2)
    level = next((k for k in range(1, LEVELS + 1) if len(np.unique(tiles_of(x, k))) <= 4 * budget), LEVELS)
    tiles, rows = reduce([tiles_of(x, level)], points(x, y, a))
    group = (np.arange(len(rows)) * min(budget, len(rows))) // len(rows)
    _, buckets = reduce([group], rows)
    pts = distinct(
        np.vstack(
            (
                buckets[0, XFIRST : AFIRST + 1],
                buckets[:, XMIN : AMIN + 1],
                buckets[:, XMAX : AMAX + 1],
                buckets[-1, XLAST : ALAST + 1],
            )
        )
    )
    return Answer(n, level, pts[:, 0], pts[:, 1], pts[:, 2], tiles[0], group, buckets)
