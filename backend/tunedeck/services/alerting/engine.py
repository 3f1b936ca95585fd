"""The alert engine: the background worker fed by the ingest writer, which judges each dirty job
(tracker.py) and stores what it finds as alerts (reconcile.py)."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from sqlalchemy import Engine
from sqlmodel import Session, select

from tunedeck.config import Settings
from tunedeck.services.alerting.tracker import Tracker, limits_of
from tunedeck.store.tables import Alert, Job, JobStatus
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.alerts")


class AlertEngine(Worker):
    """Evaluates jobs after the ingest writer commits their batches, in its own thread: a slow or
    failing evaluation never holds up ingest. Running jobs are also swept now and then, so a job that
    went silent (a hang with no sampler) is still judged."""

    name = "alert-engine"
    final_pass = True  # saves every followed job's state (a restart resumes them)
    stop_timeout_s = 30.0  # (a state takes ~0.1 s to save: 16 GPUs, hours of samples)

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        on_new: Callable[[Job, list[Alert]], None] | None = None,
        sweep_s: float = 30.0,
    ):
        super().__init__()
        self.engine, self.settings, self.on_new, self.sweep_s = engine, settings, on_new, sweep_s
        # Told of jobs whose alerts closed or changed, at once (the live streams: the stream watcher
        # would see it only on its next poll).
        self.on_closed: list[Callable[[set[int]], None]] = []
        self.interval_s = settings.alert_interval_s
        self.limits = limits_of(settings)
        self.tracker = Tracker(engine, self.limits, settings)  # used by this engine's thread only
        self._dirty: set[int] = set()
        # When each job was last judged; never reads as minus
        # infinity, so a job not yet judged is due at its first pass (without a state nothing else can
        # make it due). Not as 0: monotonic time counts from the boot, and on a machine up for less than
        # an interval "last judged at 0" held every new job back until the uptime caught up.
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

    def _closed(self, jobs: set[int]) -> None:
        for listener in self.on_closed:
            listener(jobs)

    def _sweep(self) -> None:
        with Session(self.engine) as session:
            running = session.exec(select(Job.id).where(Job.status == JobStatus.running)).all()
        self.notify(set(running))

    def _save(self, jobs: list[int]) -> None:
        for job_id in jobs:
            try:
                self.tracker.save(job_id)
            except Exception:
                log.exception("saving the alert state of job %s failed", job_id)

    def run_once(self) -> None:
        every = self.settings.alert_state_save_s
        if self.stopping:  # the final pass: nothing judged, every state saved
            if every:
                self._save(self.tracker.due(0.0))
            return
        if time.monotonic() - self._last_sweep > self.sweep_s:
            self._last_sweep = time.monotonic()
            try:
                self._sweep()
            except Exception:
                log.exception("alert sweep failed")
        if self._dirty:
            try:  # new rows fed first (their cost is per row, not per pass), so the rule below knows them
                self.tracker.pull()
            except Exception:
                log.exception("alert pull failed")
        # A job is judged at most once an interval, whatever came (new samples, points, output lines),
        # unless a sample rose well above the one before it: a spike's first sample is judged at once.
        # A job on several nodes gets a batch from each of their runners every interval: judged on
        # each it was judged as often as it has nodes, and its findings read twice as often as needed.
        interval, now = self.settings.alert_interval_s, time.monotonic()
        with self._lock:
            due = {
                j
                for j in self._dirty
                if now - self._last.get(j, -math.inf) >= interval or self.tracker.risen(j)
            }
            self._dirty -= due
        # A spike's job first, and one that rose while this pass judged others goes next: on a cluster
        # a pass judges dozens of jobs, and a spike waited for all of them (and for the pass after).
        order = sorted(due, key=lambda j: (not self.tracker.risen(j), j))
        while order:
            if self.stopping:  # the states are saved first: a pass of builds can take minutes
                with self._lock:
                    self._dirty |= set(order)
                break
            job_id = order.pop(0)
            self._last[job_id] = time.monotonic()
            try:
                self.tracker.evaluate(job_id, on_new=self.on_new, on_closed=self._closed)
            except Exception:
                log.exception("alert evaluation of job %s failed", job_id)
            with self._lock:
                jumped = sorted(j for j in self._dirty if self.tracker.risen(j))
                self._dirty -= set(jumped)
            order = jumped + [j for j in order if j not in jumped]
        if every:  # one state a pass at most: saves spread out instead of coming together
            self._save(self.tracker.due(every)[:1])
        if self._dirty:  # jobs evaluated too recently: look again shortly, not a whole interval later
            self.wake()
            time.sleep(0.05)
