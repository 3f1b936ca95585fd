"""Chart series of a job's metric points, read from the chart tiles so a 10M-point run stays fast.

Each curve is all its points when they fit in `max_points`, else the min and max of each bucket of
tiles (services/charts/pyramid.py): a loss spike is a real point of the answer at any zoom level. A zoomed
chart asks again with the window `x0..x1` and gets finer points of just that window.
"""

from __future__ import annotations

import json

import numpy as np
from sqlalchemy import Engine

from tunedeck.services.charts import pyramid
from tunedeck.services.charts.pyramid import METRIC_COLUMNS as COLUMNS
from tunedeck.services.charts.pyramid import Reader, Series


def _nonfinite(rows: list[tuple], name: str, max_points: int) -> dict:
    """Where a metric was inf or NaN (its `y` skips those points): {step, t, value}, evenly thinned
    to `max_points` (a diverged run can be NaN from some step to its end)."""
    pts = [(step, t, v) for step, t, bad in rows if (v := bad.get(name))]
    if len(pts) > max_points:
        pts = [pts[i] for i in np.unique(np.linspace(0, len(pts) - 1, max_points).round().astype(int))]
    return {"step": [p[0] for p in pts], "t": [p[1] for p in pts], "value": [p[2] for p in pts]}


def series_of(job_id: int, name: str | None, scan: int | None = None) -> Series:
    """A metric's curve (x = step, y = value, aux = the time the line was read), or with name None
    the rows themselves (y = row id)."""
    y = "id" if name is None else name  # column names come from METRICS only, never from a request
    return Series(
        pyramid.ROWS if name is None else pyramid.metric_key(name),
        f"SELECT step, {y}, t FROM metric_points WHERE job_id = ? AND {y} IS NOT NULL "
        "AND step >= ? AND step <= ? ORDER BY step, line",
        (job_id,),
        scan=scan,
    )


def metric_series(
    engine: Engine,
    *,
    job_id: int,
    max_points: int,
    x0: float | None = None,
    x1: float | None = None,
    until: int | None = None,
) -> dict:
    """Each metric as {step, t, y, n, nonfinite_points}: at most about `max_points` per metric, within
    steps x0..x1. With `until`, a row stored after it may be in the answer; `last_id` says the
    newest row the answer holds, so a stream resumed there repeats nothing."""
    pyramid.current(engine)
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("BEGIN")  # one snapshot: the tiles, the count and the newest id agree
        reader = Reader(cur, job_id)
        rows = series_of(job_id, None)
        everything = reader.extent(rows)
        # The newest row: the highest id the tiles hold, or a newer line without a step.
        (newest,) = cur.execute(
            "SELECT max(id) FROM (SELECT id FROM metric_points WHERE job_id = ? ORDER BY line DESC LIMIT 1)",
            (job_id,),
        ).fetchone()
        ids = [
            int(v)
            for v in (newest, None if everything is None else everything[pyramid.YMAX])
            if v is not None
        ]
        last_id = max(ids, default=None)
        lo, hi = (-np.inf if x0 is None else x0), (np.inf if x1 is None else x1)
        count = reader.total(rows, x0, x1)
        out: dict = {"count": count, "last_id": last_id, "downsampled": False, "series": {}}
        where = "job_id = ? AND step IS NOT NULL AND step >= ? AND step <= ?"
        # Few rows, found through their partial index: the points whose metrics were inf or NaN.
        # (SQLite would rather walk the job's step index, every row of the job.)
        bad = cur.execute(
            f"SELECT step, t, nonfinite FROM metric_points INDEXED BY ix_metric_nonfinite WHERE {where} "
            "AND nonfinite IS NOT NULL ORDER BY step, line",
            (job_id, lo, hi),
        ).fetchall()
        bad = [(step, t, json.loads(text)) for step, t, text in bad]
        for name in COLUMNS:
            ans = reader.window(series_of(job_id, name, scan=count), x0, x1, max_points)
            out["downsampled"] |= ans.reduced
            out["series"][name] = {
                "step": ans.x.astype(np.int64).tolist(),
                "t": ans.a.tolist(),
                "y": ans.y.tolist(),
                "n": ans.n,
                "nonfinite_points": _nonfinite(bad, name, max_points),
            }
        cur.close()
    finally:
        raw.rollback()
        raw.close()
    return out
