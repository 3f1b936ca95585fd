"""Alert rows from what the detectors find: one open alert per (job, kind, node, gpu), kept up to
date as its condition holds, closed when it stops; and the alert listings the routes read."""

from __future__ import annotations

import json
import logging
from bisect import bisect_left, bisect_right
from typing import Any

from sqlalchemy import func
from sqlmodel import Session, col, select

from tunedeck.alerts import SEVERITIES, Finding
from tunedeck.services.errors import NotFound
from tunedeck.store.tables import Alert, Job

log = logging.getLogger("tunedeck.alerts")
SPIKES = ("vram_spike", "vram_periodic_spikes")  # alerted as they rise, withdrawn when the rise stays up
# Kinds whose open finding follows the newest point while nothing it says changes but its running
# figures: its end, duration and count (the healthy plateau: "stayed within 0.4 GiB for 912 s"; a
# stuck loss: "for 312 logged points (steps 40 to 352)"). Its row is written again when REFRESH_S of
# the series' time have passed since its last write, or anything else changed, or it ends, not on
# every pass: rewritten each pass, the plateaus of a cluster's GPUs were a quarter of the server's CPU
# (bench/cluster_shape.py), a stuck loss a row and a commit a logged line, and each rewrite reached
# every open page as a change.
TRACKING = ("vram_plateau", "loss_stuck")
REFRESH_S = 30.0


Key = tuple[str, str, int | None]  # (kind, node, gpu): one condition of a job


def _kept(f: Finding) -> tuple:
    """What of a TRACKING finding, besides its end, makes its row be written again at once."""
    # (a plateau's step follows its end; a stuck loss's is where it began, as its `first` is)
    return (f.kind, f.node, f.gpu, f.severity, f.open, f.step is None, f.first, f.suggestion, _change(f))


def _change(f: Finding) -> str | None:
    return json.dumps(f.change) if f.change else None


def unchanged(findings: list[Finding], said: list[Finding] | None, tracked: dict[Key, float]) -> bool:
    """Whether storing `findings` of a running job would write nothing, after `said` was stored: the
    same findings but for the ends of TRACKING ones whose rows (written at the series' time
    `tracked[key]`) are not due a refresh. The alert engine reads a job's findings on each batch, and
    a plateau's end moves with every sample: without this each pass read the job's alert rows and
    committed, to change nothing (most of the engine's database work on a cluster)."""
    if said is None or len(findings) != len(said):
        return False
    for f, g in zip(findings, said):
        if f == g:
            continue
        if f.kind not in TRACKING or not f.open or _kept(f) != _kept(g):
            return False
        last = tracked.get((f.kind, f.node, f.gpu))
        if last is None or not f.t - last < REFRESH_S:
            return False
    return True


def reconcile(
    session: Session,
    job_id: int,
    findings: list[Finding],
    *,
    finished: bool,
    closed: list[Alert] | None = None,
    changed: list[Alert] | None = None,
    tracked: dict[Key, float] | None = None,
    said: list[Finding] | None = None,
) -> list[Alert]:
    """Store findings as alerts: update the episode that is open (or recomputed), open a new one when
    a closed condition recurs, close what no longer holds. Returns the alerts opened now; those closed
    now are appended to `closed`, open ones whose count, message or severity changed to `changed`;
    `tracked` is kept as the series' time each open TRACKING row was last written at (`unchanged`).
    `said`: the findings stored last (by this function, or found `unchanged`): a finding equal to its
    own there changes nothing, and only the rows of the kinds that changed are read."""
    was_open = {}
    latest: dict[Key, Alert] = {}
    same: set[Key] = set()
    if said is not None and not finished:
        before = {(g.kind, g.node, g.gpu): g for g in said}
        same = {(f.kind, f.node, f.gpu) for f in findings if before.get((f.kind, f.node, f.gpu)) == f}
        now = {(f.kind, f.node, f.gpu) for f in findings}
        kinds = {k[0] for k in now - same} | {k[0] for k in before if k not in now}
    # Only each condition's newest episode matters: the job's older ones are never loaded (a run whose
    # alerts come and go holds thousands).
    newest = select(func.max(Alert.id)).where(Alert.job_id == job_id)
    if said is not None and not finished:
        newest = newest.where(col(Alert.kind).in_(sorted(kinds)))
    newest = newest.group_by(Alert.kind, Alert.node, Alert.gpu)
    for a in session.exec(select(Alert).where(col(Alert.id).in_(newest)).order_by(col(Alert.id))):
        latest[(a.kind, a.node, a.gpu)] = a
        was_open[a.id] = a.open
    new: list[Alert] = []
    touched: list[Alert] = []
    seen = set()
    for f in findings:
        key = (f.kind, f.node, f.gpu)
        if key in same:  # as stored: its row stands as the last pass left it
            seen.add(key)
            continue
        row = latest.get(key)
        if row is not None and f.kind in SPIKES and f.t < row.first_t:
            # Every occurrence of this episode was withdrawn (a spike alerted as it rose that stayed up:
            # a level change): it closes; the older ones were another episode's.
            continue
        seen.add(key)
        is_open = f.open and not finished
        fields: dict[str, Any] = {
            "severity": f.severity,
            "t": f.t,
            "step": f.step,
            "message": f.message,
            "suggestion": f.suggestion,
            "change": _change(f),
            "open": is_open,
            "last_t": f.t,
        }
        # (The times are in order: those after a time are found by bisection.)
        if row is None or (not row.open and f.t > row.last_t):
            # A recurrence: the occurrences since the episode before (the kept ones, past KEEP of them).
            times = f.times if row is None else f.times[bisect_right(f.times, row.last_t) :]
            first, count = (f.first, f.count) if row is None else (times[0], len(times))
            assert first is not None  # a Finding sets it from its times
            row = Alert(
                job_id=job_id, kind=f.kind, node=f.node, gpu=f.gpu, first_t=first, count=count, **fields
            )
            new.append(row)
        elif (
            f.kind in TRACKING
            and row.open
            and is_open
            and f.t - row.last_t < REFRESH_S
            and (row.severity, row.step is None, row.suggestion, row.change)
            == (f.severity, f.step is None, f.suggestion, fields["change"])
        ):
            continue  # as it was, but for its end: written at the next refresh
        elif row.open or f.t > row.last_t or (is_open and f.t == row.last_t):
            # (The last: an episode whose finding went away and came back, as a spike alerted on its
            # rise does when it turns out wider than MAX_SPIKE samples and then comes back down.)
            if f.complete or f.times[0] < row.first_t:  # the kept times reach back to the episode's start
                count = len(f.times) - bisect_left(f.times, row.first_t)
            else:  # it began before them: add the occurrences since the last update
                count = row.count + len(f.times) - bisect_right(f.times, row.last_t)
            shown = (row.open, row.count, row.message, row.severity)
            for k, v in fields.items():
                setattr(row, k, v)
            row.count = max(1, count)
            if row.open and shown[0] and shown[1:] != (row.count, row.message, row.severity):
                touched.append(row)
        else:
            continue
        session.add(row)
    for key, row in latest.items():
        if row.open and (key not in seen or finished):
            row.open = False
            session.add(row)
    shut = [row for row in latest.values() if was_open.get(row.id) and not row.open]
    if tracked is not None:  # (read before the commit, which expires the rows' attributes)
        for key in latest if said is not None and not finished else list(tracked):
            tracked.pop(key, None)  # the rows read are told again; the others' stand
        for row in [*latest.values(), *new]:  # (a recurrence's new row after the episode before it)
            if row.kind in TRACKING and row.open:
                tracked[(row.kind, row.node, row.gpu)] = row.last_t
    session.commit()
    for row in new:
        session.refresh(row)
    if closed is not None:
        closed += shut
    if changed is not None:
        changed += touched
    return new


def list_alerts(
    session: Session,
    *,
    job_id: int | None = None,
    open_only: bool | None = None,
    after: int | None = None,
    min_severity: str | None = None,
    newest_first: bool = False,
    limit: int = 1000,
) -> list[Alert]:
    if job_id is not None and session.get(Job, job_id) is None:
        raise NotFound(f"job {job_id} not found")
    q = select(Alert).order_by(col(Alert.id).desc() if newest_first else col(Alert.id)).limit(limit)
    if min_severity is not None:
        q = q.where(col(Alert.severity).in_(SEVERITIES[SEVERITIES.index(min_severity) :]))
    if job_id is not None:
        q = q.where(Alert.job_id == job_id)
    if open_only is not None:
        q = q.where(Alert.open == open_only)
    if after is not None:
        q = q.where(col(Alert.id) > after)
    return list(session.exec(q))
