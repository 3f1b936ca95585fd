"""Chart series of a job's metric points, read from the chart tiles so a 10M-point run stays fast.

Each curve is all its points when they fit in `max_points`, else the min and max of each bucket of
tiles (services/charts/pyramid.py): a loss spike is a real point of the answer at any zoom level. A zoomed
chart asks again with the window `x0..x1` and gets finer points of just that window.
"""

from __future__ import annotations

import json
import re

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


def _curves(reader: Reader, cur, job_id: int, max_points: int, x0: float | None, x1: float | None) -> dict:
    """One job's curves in steps x0..x1 (the caller holds the read transaction)."""
    rows = series_of(job_id, None)
    lo, hi = (-np.inf if x0 is None else x0), (np.inf if x1 is None else x1)
    count = reader.total(rows, x0, x1)
    out: dict = {"count": count, "downsampled": False, "series": {}}
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
    return out


# The checkpoint a resumed run's train.yaml continues from, and that checkpoint's step.
RESUMED_FROM = re.compile(r"^resume_from_checkpoint:[ \t]*(.*?)[ \t]*$", re.M)
CHECKPOINT_STEP = re.compile(r"checkpoint-(\d+)/*$")
MOST_ATTEMPTS = 100  # a lineage walked no further (and never round a loop of parents)


def attempts(cur, job_id: int) -> list[dict]:
    """The job and the runs it resumed, oldest first: each {job_id, name, resumed_at} (the step of the
    checkpoint it continued from; None for the first attempt, or where the checkpoint's name has no step).
    A clone's parent ("Edit as new") is another run, not an earlier attempt: the walk stops there."""
    out: list[dict] = []
    j: int | None = job_id
    while j is not None and len(out) < MOST_ATTEMPTS and all(a["job_id"] != j for a in out):
        row = cur.execute("SELECT name, parent_id, train_yaml FROM jobs WHERE id = ?", (j,)).fetchone()
        if row is None:  # a parent deleted since: the lineage starts at its child
            break
        name, parent, yaml = row
        m = RESUMED_FROM.search(yaml or "")
        at = CHECKPOINT_STEP.search(m.group(1).strip("'\"")) if m else None
        out.append({"job_id": j, "name": name, "resumed_at": int(at.group(1)) if at else None})
        j = parent if m else None
    out.reverse()
    if (
        len(out) > 1
    ):  # the oldest attempt held: its own curve from its start (its parent is gone or a clone's)
        out[0]["resumed_at"] = None
    return out


def _lineage(cur, job_id: int, max_points: int, x0: float | None, x1: float | None) -> dict:
    """The curves of a run and of the runs it resumed as one: each attempt's points up to the step the
    next one resumed at (its later steps were done again), then the next's; each point names its job."""
    chain = attempts(cur, job_id)
    # Each attempt's steps: after the checkpoint it resumed from, through the one the next resumed from
    # (where a checkpoint's step is unknown, up to the step before the next one's first logged step).
    cuts: list[float] = [-np.inf]
    for a in chain[1:]:
        if a["resumed_at"] is not None:
            cuts.append(a["resumed_at"])
        else:
            first = Reader(cur, a["job_id"]).extent(series_of(a["job_id"], None))
            cuts.append(np.inf if first is None else first[pyramid.XFIRST] - 1)
    cuts.append(np.inf)
    windows = []
    for k, a in enumerate(chain):
        lo, hi = (
            max(cuts[k] + 1, -np.inf if x0 is None else x0),
            min(cuts[k + 1], np.inf if x1 is None else x1),
        )
        if lo <= hi:
            w0, w1 = (None if np.isinf(lo) else lo), (None if np.isinf(hi) else hi)
            windows.append((a, w0, w1, Reader(cur, a["job_id"]).total(series_of(a["job_id"], None), w0, w1)))
    total = sum(n for *_, n in windows) or 1
    out: dict = {"count": 0, "downsampled": False, "series": {}, "lineage": []}
    for a, w0, w1, n in windows:
        # The points shared out by each attempt's rows in the window, so the whole stays near max_points.
        part = _curves(
            Reader(cur, a["job_id"]), cur, a["job_id"], max(10, round(max_points * n / total)), w0, w1
        )
        out["count"] += part["count"]
        out["downsampled"] |= part["downsampled"]
        steps = [s for c in part["series"].values() for s in c["step"]]
        out["lineage"].append(
            {**a, "first_step": min(steps, default=None), "last_step": max(steps, default=None)}
        )
        for name, c in part["series"].items():
            into = out["series"].setdefault(
                name,
                {
                    "step": [],
                    "t": [],
                    "y": [],
                    "n": 0,
                    "job": [],
                    "nonfinite_points": {"step": [], "t": [], "value": []},
                },
            )
            for key in ("step", "t", "y"):
                into[key] += c[key]
            into["n"] += c["n"]
            into["job"] += [a["job_id"]] * len(c["step"])
            for key in ("step", "t", "value"):
                into["nonfinite_points"][key] += c["nonfinite_points"][key]
    return out


def metric_series(
    engine: Engine,
    *,
    job_id: int,
    max_points: int,
    x0: float | None = None,
    x1: float | None = None,
    until: int | None = None,
    lineage: bool = False,
) -> dict:
    """Each metric as {step, t, y, n, nonfinite_points}: at most about `max_points` per metric, within
    steps x0..x1. With `until`, a row stored after it may be in the answer; `last_id` says the
    newest row the answer holds, so a stream resumed there repeats nothing. With `lineage`, a resumed
    run's curves continue those of the runs it resumed (`_lineage`), each point naming its job."""
    pyramid.current(engine)
    raw = engine.raw_connection()
    try:
        cur = raw.cursor()
        cur.execute("BEGIN")  # one snapshot: the tiles, the count and the newest id agree
        reader = Reader(cur, job_id)
        everything = reader.extent(series_of(job_id, None))
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
        if lineage:
            out = _lineage(cur, job_id, max_points, x0, x1)
        else:
            out = _curves(reader, cur, job_id, max_points, x0, x1)
        out["last_id"] = max(ids, default=None)
        cur.close()
    finally:
        raw.rollback()
        raw.close()
    return out
