"""A job's memory series: pages after a cursor, a time window, and charts read from the chart tiles."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from sqlmodel import Session, col, select

from tunedeck.schemas import MemoryGpu
from tunedeck.services.charts import pyramid
from tunedeck.services.charts.pyramid import Reader, Series
from tunedeck.services.jobs.records import get_job
from tunedeck.store.tables import MEMORY_TELEMETRY, MemorySample

# The job's devices, (node, gpu) in order, one index seek each on the samples' key: the queries
# that go on from `g` add their own SELECT.
DEVICES = """
WITH RECURSIVE g(node, gpu) AS (
  SELECT * FROM (SELECT node, gpu FROM memory_samples WHERE job_id = :job ORDER BY node, gpu LIMIT 1)
  UNION ALL
  SELECT m.node, m.gpu FROM g JOIN memory_samples m ON m.id = coalesce(
    (SELECT id FROM memory_samples WHERE job_id = :job AND node = g.node AND gpu > g.gpu ORDER BY gpu LIMIT 1),
    (SELECT id FROM memory_samples WHERE job_id = :job AND node > g.node ORDER BY node, gpu LIMIT 1))
)
"""
# Each device's newest sample (and whether it counts xGMI traffic).
GPUS = (
    DEVICES
    + """SELECT m.node, m.gpu, m.name, m.total_bytes,
  m.xgmi_read_bytes IS NOT NULL OR m.xgmi_write_bytes IS NOT NULL FROM g JOIN memory_samples m ON m.id = (
  SELECT id FROM memory_samples WHERE job_id = :job AND node = g.node AND gpu = g.gpu ORDER BY t DESC LIMIT 1)
"""
)
RAW = (
    "SELECT t, used_bytes, id FROM memory_samples WHERE job_id = ? AND node = ? AND gpu = ? AND t >= ? "
    "AND t <= ? ORDER BY t, line, id"
)
COLUMNS = (
    "id",
    "t",
    "node",
    "gpu",
    "used_bytes",
    "total_bytes",
    "util",
    "power_w",
    "temp_c",
    *MEMORY_TELEMETRY,
)
# Each device's identity from its first sample (the sampler sends it with a device's first sample):
# one seek a device, never a walk through a long series looking for it.
IDENTITY = (
    DEVICES
    + """SELECT g.node, g.gpu, m.serial, m.uuid, m.partition, m.power_shared_with FROM g JOIN memory_samples m
  ON m.id = (SELECT id FROM memory_samples WHERE job_id = :job AND node = g.node AND gpu = g.gpu ORDER BY t LIMIT 1)
"""
)


def _gpus(cur, job_id: int) -> list[tuple]:
    return cur.execute(GPUS, {"job": job_id}).fetchall()


def gpus_of(session: Session, job_id: int, node: str | None = None) -> list[MemoryGpu]:
    cur = session.connection().connection.cursor()
    try:
        ident = {(r[0], r[1]): r[2:] for r in cur.execute(IDENTITY, {"job": job_id}).fetchall()}
        out = []
        for nd, g, n, tb, _ in _gpus(cur, job_id):
            if node is not None and nd != node:
                continue
            serial, uuid, partition, shared = ident.get((nd, g), (None,) * 4)
            out.append(
                MemoryGpu(
                    node=nd,
                    gpu=g,
                    name=n,
                    total_bytes=tb,
                    serial=serial,
                    uuid=uuid,
                    partition=partition,
                    power_shared_with=shared,
                )
            )
        return out
    finally:
        cur.close()


def _rows(cur, ids: list[int]) -> dict[int, SimpleNamespace]:
    out = {}
    for i in range(0, len(ids), 900):  # SQLite's bound-parameter limit, with room
        chunk = ids[i : i + 900]
        q = f"SELECT {', '.join(COLUMNS)} FROM memory_samples WHERE id IN ({', '.join('?' * len(chunk))})"
        for r in cur.execute(q, chunk):
            out[r[0]] = SimpleNamespace(**dict(zip(COLUMNS, r)))
    return out


XGMI = ("xgmi_read_bytes", "xgmi_write_bytes")


def counters(cur, ids: list[int]) -> dict[int, tuple]:
    """The cumulative xGMI counters of these samples, by id: a downsampled series keeps them on the
    samples it draws, and the growth between two drawn samples over their time apart is the average
    rate of that stretch, exact however many samples lie between."""
    out: dict[int, tuple] = {}
    for i in range(0, len(ids), 900):  # SQLite's bound-parameter limit, with room
        chunk = ids[i : i + 900]
        q = f"SELECT id, {', '.join(XGMI)} FROM memory_samples WHERE id IN ({', '.join('?' * len(chunk))})"
        out |= {r[0]: r[1:] for r in cur.execute(q, chunk)}
    return out


READING_RAW = (
    "SELECT t, {column}, id FROM memory_samples WHERE job_id = ? AND node = ? AND gpu = ? AND {column} IS NOT NULL "
    "AND t >= ? AND t <= ? ORDER BY t, line, id"
)


def readings(
    reader: Reader,
    job_id: int,
    node: str,
    gpu: int,
    at: np.ndarray,
    t0: float | None,
    t1: float | None,
    max_points: int,
    floor: int,
) -> dict[str, list]:
    """Each reading of the device's tiles (utilisation, temperatures) at the times `at` of a
    downsampled memory series, from its own series downsampled in the same window: each of its points
    goes to the drawn sample nearest in time, which shows the highest of them (so a hot or busy
    spike stays drawn), or the nearest point where none came to it. A reading the device never sent
    is left out."""
    out: dict[str, list] = {}
    if not len(at):
        return out
    mid = (at[1:] + at[:-1]) / 2  # where one drawn sample's stretch of time ends and the next begins
    for prefix, column in pyramid.READINGS.items():
        s = Series(
            pyramid.memory_key(node, gpu, prefix),
            READING_RAW.format(column=column),
            (job_id, node, gpu),
            floor=floor,
        )
        ans = reader.window(s, t0, t1, max_points)
        if not ans.n:
            continue
        owner = np.searchsorted(mid, ans.x)  # the drawn sample each reading point belongs to
        top = np.full(len(at), -np.inf)
        np.maximum.at(top, owner, ans.y)
        near = np.clip(np.searchsorted(ans.x, at), 0, len(ans.x) - 1)
        before = np.maximum(near - 1, 0)
        near = np.where(np.abs(ans.x[before] - at) < np.abs(ans.x[near] - at), before, near)
        out[column] = np.where(np.isfinite(top), top, ans.y[near]).tolist()
    return out


def chart(
    engine,
    *,
    job_id: int,
    node: str | None = None,
    gpu: int | None,
    max_points: int,
    t0: float | None,
    t1: float | None,
) -> tuple[list[Any], int | None, bool]:
    """Each GPU's series in the window from the tiles: every sample when they fit in `max_points`,
    else each bucket's lowest and highest sample (its id, time and bytes, and the utilisation and
    temperatures of `readings`, and the cumulative xGMI counters; power and the rest are on whole
    samples only)."""
    pyramid.current(engine)
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("BEGIN")  # one snapshot
        reader = Reader(cur, job_id)
        pruned = cur.execute("SELECT level FROM chart_pruned WHERE job_id = ?", (job_id,)).fetchone()
        gpus = {
            (nd, g): (tb, xgmi)
            for nd, g, _, tb, xgmi in _gpus(cur, job_id)
            if (gpu is None or g == gpu) and (node is None or nd == node)
        }
        rows, reduced = [], False
        for (nd, g), (total, xgmi) in gpus.items():
            s = Series(pyramid.memory_key(nd, g), RAW, (job_id, nd, g), floor=pruned[0] if pruned else 0)
            ans = reader.window(s, t0, t1, max_points)
            reduced |= ans.reduced
            if ans.level == 0 and ans.n:  # every sample of the window: the rows themselves
                found = cur.execute(
                    f"SELECT {', '.join(COLUMNS)} FROM memory_samples WHERE job_id = ? AND node = ? "
                    "AND gpu = ? AND t >= ? AND t <= ?",
                    (job_id, nd, g, ans.x[0], ans.x[-1]),
                ).fetchall()
                rows += [SimpleNamespace(**dict(zip(COLUMNS, r))) for r in found]
                continue
            floor = pruned[0] if pruned else 0
            kept = readings(reader, job_id, nd, g, ans.x, t0, t1, max_points, floor)
            acc = counters(cur, [int(a) for a in ans.a]) if xgmi else {}
            rows += [
                SimpleNamespace(
                    **{
                        **dict.fromkeys(MEMORY_TELEMETRY),
                        "id": int(a),
                        "t": t,
                        "node": nd,
                        "gpu": g,
                        "used_bytes": int(y),
                        "total_bytes": total,
                        "util": None,
                        "power_w": None,
                        "temp_c": None,
                        **{name: v[i] for name, v in kept.items()},
                        **dict(zip(XGMI, acc.get(int(a), ()))),
                    }
                )
                for i, (t, y, a) in enumerate(zip(ans.x.tolist(), ans.y.tolist(), ans.a.tolist()))
            ]
        cur.close()
    finally:
        raw.rollback()
        raw.close()
    rows.sort(key=lambda r: r.id)
    return rows, (max((r.id for r in rows), default=None)), reduced


def memory_page(
    session: Session,
    *,
    job_id: int,
    node: str | None = None,
    gpu: int | None,
    after: int | None,
    max_points: int | None,
    t0: float | None,
    t1: float | None,
    limit: int,
) -> tuple[list[Any], int | None, bool]:
    """Samples in id order; with `max_points`, each GPU's series in the window is downsampled."""
    get_job(session, job_id)
    if max_points is not None and after is None:
        rows, nxt, reduced = chart(
            session.get_bind(), job_id=job_id, node=node, gpu=gpu, max_points=max_points, t0=t0, t1=t1
        )
        return rows, (after if nxt is None else nxt), reduced
    q = select(MemorySample).where(MemorySample.job_id == job_id).order_by(col(MemorySample.id))
    if gpu is not None:
        q = q.where(MemorySample.gpu == gpu)
    if node is not None:
        q = q.where(MemorySample.node == node)
    if after is not None:
        q = q.where(col(MemorySample.id) > after)
    if t0 is not None:
        q = q.where(col(MemorySample.t) >= t0)
    if t1 is not None:
        q = q.where(col(MemorySample.t) <= t1)
    if max_points is None:
        rows = list(session.exec(q.limit(limit)))
        return rows, (rows[-1].id if rows else after), False
    # After a cursor the tiles cannot help (they hold no ids' order): the same buckets, in memory.
    cols = q.with_only_columns(MemorySample.id, MemorySample.gpu, MemorySample.t, MemorySample.used_bytes)
    data = session.connection().execute(cols.add_columns(MemorySample.node)).all()
    if not data:
        return [], after, False
    arr = np.array([tuple(r)[:4] for r in data], dtype=np.float64)  # id, gpu, t, used (exact below 2**53)
    code = {n: i for i, n in enumerate(sorted({r[4] for r in data}))}
    arr[:, 1] += (
        np.fromiter((code[r[4]] for r in data), np.float64, len(data)) * pyramid.NODE_CODE
    )  # a series per (node, gpu)
    keep, reduced = [], False
    for g in np.unique(arr[:, 1]):
        series = arr[arr[:, 1] == g]
        ans = pyramid.downsample(series[:, 2], series[:, 3], series[:, 0], max_points)
        reduced |= ans.reduced
        keep += ans.a.astype(np.int64).tolist()
    cur = session.connection().connection.cursor()
    try:
        found = _rows(cur, sorted(set(keep)))
    finally:
        cur.close()
    return [found[i] for i in sorted(found)], int(arr[:, 0].max()), reduced
