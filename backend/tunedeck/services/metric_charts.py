"""Chart series of a job's metric points, downsampled on the server so a 1M-point run stays fast.

MinMaxLTTB (tsdownsample) keeps each bucket's extremes, so a loss spike survives any zoom level.
A zoomed chart asks again with the window `x0..x1` and gets finer points of just that window.
"""

from __future__ import annotations

import json
import threading

import numpy as np
from sqlalchemy import Engine
from tsdownsample import MinMaxLTTBDownsampler

from tunedeck.lflog import METRICS

CACHE_SIZE = 16  # whole answers, for several screens showing the same big run
_CACHE: dict[tuple, dict] = {}
_CACHE_LOCK = threading.Lock()
# The curves by step; total_tokens too, so a chart can put tokens on its x axis.
COLUMNS = tuple(k for k in METRICS if k != "epoch")


def downsample_indices(x: np.ndarray, y: np.ndarray, max_points: int) -> np.ndarray:
    if len(y) <= max_points:
        return np.arange(len(y))
    return np.sort(MinMaxLTTBDownsampler().downsample(x, y, n_out=max_points, parallel=False))


def _nonfinite(rows: list[tuple], name: str, max_points: int) -> dict:
    """Where a metric was inf or NaN (its `y` skips those points): {step, t, value}, evenly thinned
    to `max_points` (a diverged run can be NaN from some step to its end)."""
    pts = [(step, t, v) for step, t, bad in rows if (v := bad.get(name))]
    if len(pts) > max_points:
        pts = [pts[i] for i in np.unique(np.linspace(0, len(pts) - 1, max_points).round().astype(int))]
    return {"step": [p[0] for p in pts], "t": [p[1] for p in pts], "value": [p[2] for p in pts]}


def metric_series(
    engine: Engine,
    *,
    job_id: int,
    max_points: int,
    x0: float | None = None,
    x1: float | None = None,
    until: int | None = None,
) -> dict:
    """Each metric as {step, t, y, n, nonfinite_points}: at most `max_points` per metric, within steps
    x0..x1, ids <= until."""
    where = ["job_id = :j", "step IS NOT NULL"]
    params: dict = {"j": job_id}
    for cond, param, value in (
        ("step >= :x0", "x0", x0),
        ("step <= :x1", "x1", x1),
        ("id <= :u", "u", until),
    ):
        if value is not None:
            where.append(cond)
            params[param] = value
    sql = f"SELECT id, step, t, {', '.join(COLUMNS)} FROM metric_points WHERE {' AND '.join(where)} ORDER BY step, line"
    # The DBAPI cursor straight into numpy: SQLAlchemy Row objects cost ~10x more for 1M rows.
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        last_id = cur.execute(
            "SELECT max(id) FROM metric_points WHERE job_id = :j"
            + (" AND id <= :u" if until is not None else ""),
            params,
        ).fetchone()[0]
        # Same newest row, same question: the answer cannot have changed (rows are never edited).
        key = (str(engine.url), job_id, max_points, x0, x1, last_id)
        if (hit := _CACHE.get(key)) is not None:
            return hit
        rows = cur.execute(sql, params).fetchall()
        # Few rows, found through their partial index: the points whose metrics were inf or NaN.
        # (SQLite would rather walk the job's step index, every row of the job.)
        bad = cur.execute(
            f"SELECT step, t, nonfinite FROM metric_points INDEXED BY ix_metric_nonfinite WHERE "
            f"{' AND '.join(where)} AND nonfinite IS NOT NULL ORDER BY step, line",
            params,
        ).fetchall()
        cur.close()
    finally:
        raw.close()
    bad = [(step, t, json.loads(text)) for step, t, text in bad]
    data = np.array(rows, dtype=np.float64).reshape(len(rows), 3 + len(COLUMNS))
    del rows
    step, t = data[:, 1], data[:, 2]
    out: dict = {
        "count": len(data),
        "last_id": int(last_id) if last_id is not None else None,
        "downsampled": False,
        "series": {},
    }
    for i, name in enumerate(COLUMNS):
        y = data[:, 3 + i]
        keep = ~np.isnan(y)
        xs, ys, ts = step[keep], y[keep], t[keep]
        idx = downsample_indices(xs, ys, max_points)
        out["downsampled"] |= len(idx) < len(ys)
        out["series"][name] = {
            "step": xs[idx].astype(int).tolist(),
            "t": ts[idx].tolist(),
            "y": ys[idx].tolist(),
            "n": len(ys),
            "nonfinite_points": _nonfinite(bad, name, max_points),
        }
    with _CACHE_LOCK:  # requests run in a thread pool
        _CACHE[key] = out
        while len(_CACHE) > CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
    return out
