"""A job's memory series: pages after a cursor, a time window, and extreme-preserving downsampling."""

from __future__ import annotations

import numpy as np
from sqlalchemy import func
from sqlmodel import Session, col, select
from tsdownsample import MinMaxLTTBDownsampler

from tunedeck.schemas import MemoryGpu
from tunedeck.services.jobs import get_job
from tunedeck.tables import MemorySample


def downsample(t: np.ndarray, y: np.ndarray, max_points: int) -> np.ndarray:
    """Indices to keep: MinMaxLTTB (shape-faithful, extremes preselected), plus every local bucket
    maximum LTTB passed over, so no spike's peak is lost from a memory chart."""
    n = len(y)
    if n <= max_points:
        return np.arange(n)
    keep = MinMaxLTTBDownsampler().downsample(t, y, n_out=max(3, max_points))
    # LTTB picks one point per bucket; a bucket's peak can lose to a steeper neighbour. Guarantee it.
    buckets = np.array_split(np.arange(n), max(1, max_points // 2))
    peaks = [b[np.argmax(y[b])] for b in buckets if len(b)]
    return np.unique(np.concatenate([keep, np.asarray(peaks, dtype=keep.dtype)]))


def gpus_of(session: Session, job_id: int) -> list[MemoryGpu]:
    q = (
        select(MemorySample.gpu, func.max(MemorySample.name), func.max(MemorySample.total_bytes))
        .where(MemorySample.job_id == job_id)
        .group_by(MemorySample.gpu)
        .order_by(MemorySample.gpu)
    )
    return [MemoryGpu(gpu=g, name=n, total_bytes=tb) for g, n, tb in session.exec(q)]


def memory_page(
    session: Session,
    *,
    job_id: int,
    gpu: int | None,
    after: int | None,
    max_points: int | None,
    t0: float | None,
    t1: float | None,
    limit: int,
) -> tuple[list[MemorySample], int | None, bool]:
    """Samples in id order; with `max_points`, each GPU's series in the window is downsampled."""
    get_job(session, job_id)
    q = select(MemorySample).where(MemorySample.job_id == job_id).order_by(col(MemorySample.id))
    if gpu is not None:
        q = q.where(MemorySample.gpu == gpu)
    if after is not None:
        q = q.where(col(MemorySample.id) > after)
    if t0 is not None:
        q = q.where(col(MemorySample.t) >= t0)
    if t1 is not None:
        q = q.where(col(MemorySample.t) <= t1)
    if max_points is None:
        rows = list(session.exec(q.limit(limit)))
        return rows, (rows[-1].id if rows else after), False
    # Downsample from three plain columns (a million ORM rows would take seconds), then load
    # only the rows that survive.
    cols = q.with_only_columns(MemorySample.id, MemorySample.gpu, MemorySample.t, MemorySample.used_bytes)
    data = session.connection().execute(cols).all()
    if not data:
        return [], after, False
    # Plain tuples first: numpy probes Row objects by key, which costs seconds per million rows.
    arr = np.array([tuple(r) for r in data], dtype=np.float64)  # id, gpu, t, used (exact below 2**53)
    nxt = int(arr[:, 0].max())
    keep, reduced = [], False
    for g in np.unique(arr[:, 1]):
        series = arr[arr[:, 1] == g]
        series = series[np.argsort(series[:, 2], kind="stable")]
        idx = downsample(np.ascontiguousarray(series[:, 2]), np.ascontiguousarray(series[:, 3]), max_points)
        reduced = reduced or len(idx) < len(series)
        keep.append(series[idx, 0])
    ids = np.unique(np.concatenate(keep)).astype(np.int64).tolist()
    out: list[MemorySample] = []
    for i in range(0, len(ids), 900):  # SQLite's bound-parameter limit
        out += session.exec(select(MemorySample).where(col(MemorySample.id).in_(ids[i : i + 900]))).all()
    out.sort(key=lambda r: r.id)
    return out, nxt, reduced
