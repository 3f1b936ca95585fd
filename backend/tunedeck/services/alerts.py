"""Alerts in the database: load a job's series, run the pure engine, keep one open alert per
(job, kind, gpu) up to date; and the background evaluator fed by the ingest writer."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import yaml
from sqlalchemy import Engine, or_
from sqlmodel import Session, col, select

from tunedeck.alerts import SEVERITIES, Finding, Limits, Point, Series, analyze
from tunedeck.config import Settings
from tunedeck.models import Alert, Job, JobStatus, LogLine, MemorySample, MetricPoint
from tunedeck.services.jobs import get_job
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.alerts")
LIVE_WINDOW_S = 3 * 3600  # a running job is judged on its recent past; a finished one on all of it
LOG_PATTERNS = ("%out of memory%", "%OutOfMemoryError%", "%allocate memory%", "%MemoryError%",
                "%memory allocation of%", "%allocator cache flushes%")  # a cheap prefilter of OOM/FLUSH


def limits_of(settings: Settings) -> Limits:
    return Limits(near_oom_share=settings.alert_near_oom_share, stall_min_s=settings.alert_stall_min_s,
                  hold_s=settings.alert_hold_s)


def job_config(job: Job) -> tuple[dict[str, Any], dict[str, Any] | None]:
    try:
        cfg = yaml.safe_load(job.train_yaml or "") or {}
    except yaml.YAMLError:
        cfg = {}
    try:
        ds = json.loads(job.ds_config) if job.ds_config else None
    except ValueError:
        ds = None
    return (cfg if isinstance(cfg, dict) else {}), ds


def _loss(p: MetricPoint) -> tuple[float | None, float | None]:
    # The columns hold finite numbers only; `nonfinite` names an inf or NaN ("inf" reads back as a float).
    bad = json.loads(p.nonfinite) if p.nonfinite else {}
    return (float(bad["loss"]) if "loss" in bad else p.loss,
            float(bad["eval_loss"]) if "eval_loss" in bad else p.eval_loss)


def load_series(session: Session, job: Job, *, now: float | None = None) -> Series:
    running = job.status == JobStatus.running
    since = (now or time.time()) - LIVE_WINDOW_S if running else None
    mq = select(MemorySample).where(MemorySample.job_id == job.id).order_by(col(MemorySample.t))
    pq = select(MetricPoint).where(MetricPoint.job_id == job.id).order_by(col(MetricPoint.line))
    if since is not None:
        mq, pq = mq.where(MemorySample.t >= since), pq.where(MetricPoint.t >= since)
    memory: dict[int, list[tuple[float, int, int | None]]] = {}
    names: dict[int, str] = {}
    for m in session.exec(mq):
        memory.setdefault(m.gpu, []).append((m.t, m.used_bytes, m.total_bytes))
        if m.name:
            names[m.gpu] = m.name
    points = []
    for p in session.exec(pq):
        loss, eval_loss = _loss(p)
        points.append(Point(t=p.t, step=p.step, loss=loss, eval_loss=eval_loss))
    lq = (select(LogLine.t, LogLine.text).where(LogLine.job_id == job.id)
          .where(or_(*(col(LogLine.text).like(x) for x in LOG_PATTERNS))).order_by(col(LogLine.line)))
    cfg, ds = job_config(job)
    return Series(memory=memory, points=points, logs=[(t, x) for t, x in session.exec(lq)], config=cfg, ds=ds,
                  gpu_names=names, devices=[int(d) for d in job.devices.split(",")] if job.devices else [],
                  running=running, now=now if running else None)


def reconcile(session: Session, job_id: int, findings: list[Finding], *, finished: bool) -> list[Alert]:
    """Store findings as alerts: update the episode that is open (or recomputed), open a new one when
    a closed condition recurs, close what no longer holds. Returns the alerts opened now."""
    latest: dict[tuple[str, int | None], Alert] = {}
    for a in session.exec(select(Alert).where(Alert.job_id == job_id).order_by(col(Alert.id))):
        latest[(a.kind, a.gpu)] = a
    new: list[Alert] = []
    seen = set()
    for f in findings:
        key = (f.kind, f.gpu)
        seen.add(key)
        row = latest.get(key)
        is_open = f.open and not finished
        fields = {"severity": f.severity, "t": f.t, "step": f.step, "message": f.message, "suggestion": f.suggestion,
                  "open": is_open, "last_t": f.t}
        if row is None or (not row.open and f.t > row.last_t and any(t > row.last_t for t in f.times)):
            times = [t for t in f.times if row is None or t > row.last_t]
            row = Alert(job_id=job_id, kind=f.kind, gpu=f.gpu, first_t=times[0], count=len(times), **fields)
            new.append(row)
        elif row.open or f.t > row.last_t:
            for k, v in fields.items():
                setattr(row, k, v)
            row.count = max(1, sum(1 for t in f.times if t >= row.first_t))
        else:
            continue
        session.add(row)
    for key, row in latest.items():
        if row.open and (key not in seen or finished):
            row.open = False
            session.add(row)
    session.commit()
    for row in new:
        session.refresh(row)
    return new


def evaluate(engine: Engine, job_id: int, *, limits: Limits, now: float | None = None,
             on_new: Callable[[Job, list[Alert]], None] | None = None) -> list[Alert]:
    with Session(engine) as session:
        job = get_job(session, job_id)
        series = load_series(session, job, now=now or time.time())
        findings = analyze(series, limits)
        new = reconcile(session, job_id, findings, finished=job.status.finished)
        if new and on_new:
            on_new(job, new)
        return new


def list_alerts(session: Session, *, job_id: int | None = None, open_only: bool | None = None,
                after: int | None = None, limit: int = 1000) -> list[Alert]:
    if job_id is not None:
        get_job(session, job_id)
    q = select(Alert).order_by(col(Alert.id)).limit(limit)
    if job_id is not None:
        q = q.where(Alert.job_id == job_id)
    if open_only is not None:
        q = q.where(Alert.open == open_only)
    if after is not None:
        q = q.where(col(Alert.id) > after)
    return list(session.exec(q))


def at_least(severity: str, floor: str) -> bool:
    return SEVERITIES.index(severity) >= SEVERITIES.index(floor)


class AlertEngine(Worker):
    """Evaluates jobs after the ingest writer commits their batches, in its own thread: a slow or
    failing evaluation never holds up ingest. Running jobs are also swept now and then, so a job that
    went silent (a hang with no sampler) is still judged."""

    name = "alert-engine"

    def __init__(self, engine: Engine, settings: Settings, on_new: Callable[[Job, list[Alert]], None] | None = None,
                 sweep_s: float = 30.0):
        super().__init__()
        self.engine, self.settings, self.on_new, self.sweep_s = engine, settings, on_new, sweep_s
        self.interval_s = settings.alert_interval_s
        self.limits = limits_of(settings)
        self._dirty: set[int] = set()
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()
        self._last_sweep = time.monotonic()

    def notify(self, jobs: set[int]) -> None:
        """An IngestWriter listener: only marks the jobs; never blocks the writer."""
        with self._lock:
            self._dirty |= set(jobs)
        self.wake()

    def job_ended(self, job_id: int) -> None:
        """JobState's call once a job's end has committed: its final judgement closes what was open."""
        self.notify({job_id})

    def _sweep(self) -> None:
        with Session(self.engine) as session:
            running = session.exec(select(Job.id).where(Job.status == JobStatus.running)).all()
        self.notify(set(running))

    def run_once(self) -> None:
        if time.monotonic() - self._last_sweep > self.sweep_s:
            self._last_sweep = time.monotonic()
            try:
                self._sweep()
            except Exception:
                log.exception("alert sweep failed")
        with self._lock:
            due = {j for j in self._dirty if time.monotonic() - self._last.get(j, 0.0) >= self.settings.alert_interval_s}
            self._dirty -= due
        for job_id in sorted(due):
            self._last[job_id] = time.monotonic()
            try:
                evaluate(self.engine, job_id, limits=self.limits, on_new=self.on_new)
            except Exception:
                log.exception("alert evaluation of job %s failed", job_id)
        if self._dirty:  # jobs evaluated too recently: look again shortly, not a whole interval later
            self.wake()
            time.sleep(0.05)
