"""The one writer for telemetry: batches from runners, grouped into few transactions.

Requests hand their batch to the writer thread and wait for its commit, so a runner's batch is
acknowledged only once it is on disk. Every item has a natural key (its line number), and rows go
in with INSERT ... ON CONFLICT DO NOTHING: a batch sent twice, or replayed from a runner's outbox
file, is stored once.
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import repeat
from typing import Any, Protocol

from sqlalchemy import Connection, Engine, or_, select, update

from tunedeck.contract.lflog import METRICS as POINT_KEYS
from tunedeck.contract.lflog import parse_point
from tunedeck.contract.protocol import MemoryColumns, TelemetryBatch
from tunedeck.services.charts import pyramid
from tunedeck.services.ingest import pace
from tunedeck.services.ingest.storage import StorageFault, StorageHealth, fault_of
from tunedeck.services.jobs import jobstate
from tunedeck.services.jobs.jobstate import Ended, JobState
from tunedeck.store import bulk
from tunedeck.store.tables import MEMORY_TELEMETRY, Job, JobStatus, LogLine, MemorySample, MetricPoint, core
from tunedeck.workers import Worker

METRICS = core(MetricPoint)
LOGS = core(LogLine)
JOBS = core(Job)
MEMORY = core(MemorySample)
MEMORY_KEYS = (
    "line",
    "t",
    "gpu",
    "used_bytes",
    "total_bytes",
    "util",
    "power_w",
    "temp_c",
    "name",
    *MEMORY_TELEMETRY,
)
MEMORY_REQUIRED = MEMORY_KEYS[:4]

log = logging.getLogger("tunedeck.ingest")
AHEAD = 2  # groups at the store at once


def plain(batch: TelemetryBatch) -> dict[str, Any]:
    """A validated batch as the writer takes it; memory columns go on as the validated lists (no
    dict per sample on the way to the disk)."""
    out = batch.model_dump(exclude={"memory"})
    mem = batch.memory
    out["memory"] = dict(mem) if isinstance(mem, MemoryColumns) else [m.model_dump() for m in mem]
    return out


def memory_columns(memory: Any) -> dict[str, list]:
    """Memory samples as one list per column, from either form a batch may carry (rows or columns)."""
    if not memory:
        return {}
    if isinstance(memory, dict):
        return {k: v for k, v in memory.items() if k in MEMORY_KEYS and v is not None}
    cols = {k: [m.get(k) for m in memory] for k in MEMORY_KEYS}
    return {k: v for k, v in cols.items() if k in MEMORY_REQUIRED or any(x is not None for x in v)}


def samples(memory: Any) -> int:
    """How many samples a batch's `memory` holds, in either form."""
    if isinstance(memory, dict):
        return len(memory.get("line") or ())
    return len(memory or ())


def _insert(conn: Connection, table: str, names: tuple[str, ...], rows: list[tuple], key: str) -> None:
    """Plain tuples, a few hundred rows a statement (`bulk.insert`); a row whose `key` is already stored
    stays as it is. Table, column and key names come from code, never from a request."""
    cur = bulk.driver_cursor(conn)
    try:
        bulk.insert(cur, f"INSERT INTO {table} ({', '.join(names)})", rows, f"ON CONFLICT ({key}) DO NOTHING")
    finally:
        cur.close()


def insert_memory(conn: Connection, job_id: int, cols: dict[str, list], node: str = "") -> None:
    """The sampler's per-interval maxima, keyed by node, device, time and sample number (no object
    per sample)."""
    n = len(cols.get("line") or ())
    if not n:
        return
    names = tuple(k for k in MEMORY_KEYS if k in cols)
    rows = list(zip(repeat(job_id, n), repeat(node, n), *(cols[k] for k in names)))
    _insert(conn, MEMORY.name, ("job_id", "node", *names), rows, "job_id, node, gpu, t, line")


def summarise(conn: Connection, job_id: int, points: list[dict[str, Any]], cols: dict[str, list]) -> None:
    """What the job's team row shows, brought up to date with one batch: the peak over its samples, the
    largest device, the loss of its newest line that has one (only if newer than the one kept). Each
    is a max, or kept by line number, so a batch sent twice or replayed late changes nothing, and the
    team feed reads the row instead of the run (services/live/feed.py)."""
    used = cols.get("used_bytes")
    if used:
        sizes = [x for x in cols.get("total_bytes") or () if x is not None]
        conn.exec_driver_sql(SUMMARY_PEAK, (max(used), max(sizes) if sizes else None, job_id))
    newest = None
    for r in points:  # (a batch's lines in any order: the largest line wins)
        bad = json.loads(r["nonfinite"]).get("loss") if r["nonfinite"] else None
        if (r["loss"] is not None or bad is not None) and (newest is None or r["line"] > newest[0]):
            newest = (r["line"], r["loss"], bad)
    if newest is not None:
        line, loss, bad = newest
        conn.exec_driver_sql(SUMMARY_LOSS, (loss, bad, line, job_id, line))


# Plain SQL, run once or twice a batch (a Core update() costs more to build than to run). SQLite's
# max() of several arguments is NULL if any is: the coalesce keeps an unknown size unknown.
SUMMARY_PEAK = (
    "UPDATE jobs SET peak_vram_bytes = max(coalesce(peak_vram_bytes, 0), ?), total_vram_bytes = "
    "coalesce(max(coalesce(total_vram_bytes, 0), ?), total_vram_bytes) WHERE id = ?"
)
SUMMARY_LOSS = (
    "UPDATE jobs SET last_loss = ?, last_loss_nonfinite = ?, last_loss_line = ? "
    "WHERE id = ? AND (last_loss_line IS NULL OR last_loss_line < ?)"
)
# Every batch's, likewise plain SQL.
PROGRESS = (
    "UPDATE jobs SET current_steps = ?, total_steps = ?, percentage = ?, eta_seconds = ? "
    "WHERE id = ? AND (current_steps IS NULL OR current_steps <= ?)"
)
LAST_SEQ = "UPDATE jobs SET last_batch_seq = ? WHERE id = ? AND last_batch_seq < ?"


OUTSIDE_STOP = (
    "stopped from outside tunedeck: the runner got SIGTERM or SIGINT with no cancel asked for (a node "
    "failure, a Slurm time limit or preemption, an admin's scancel, or a kill on the node)"
)


TIME_LIMIT = (
    "stopped for its allocation's time limit: the runner was warned (SIGUSR1, Slurm's --signal) and the "
    "trainer stopped after a step, saving a checkpoint"
)
RESUME_PENDING = "pending"  # jobs.auto_resume: services/jobs/resume.py resumes it (or says why not)


def _cancel_asked(conn: Connection, job_id: int) -> bool:
    """Whether a cancel of this job was asked for (the API, the CLI, the idle chat stop)."""
    return conn.execute(select(JOBS.c.cancel_requested_at).where(JOBS.c.id == job_id)).scalar() is not None


def final_status(*, exit_code: int | None, cancelled: bool) -> JobStatus:
    if cancelled:
        return JobStatus.cancelled
    return JobStatus.succeeded if exit_code == 0 else JobStatus.failed


def apply_batch(conn: Connection, job_id: int, batch: dict[str, Any]) -> None:
    """Store one batch (a dict shaped like models.TelemetryBatch); idempotent."""
    rows, progress = [], None
    for m in batch.get("metrics", ()):
        p = parse_point(m["raw"], m.get("extra"))
        rows.append(
            {
                "job_id": job_id,
                "line": m["line"],
                "t": m["t"],
                "raw": m["raw"],
                **{k: p.get(k) for k in ("step", "total_steps", "percentage", "eta_seconds")},
                **{k: p.get(k) for k in (*POINT_KEYS, "nonfinite", "extra")},
            }
        )
    if any(r["step"] is not None for r in rows):
        pace.apply(rows, pace.first_point(conn, job_id), trust_logged=not pace.resumed(conn, job_id))
        progress = dict([r for r in rows if r["step"] is not None][-1])
    for r in rows:
        del r["percentage"], r["eta_seconds"]  # the job's progress, not columns of a point
    if rows:  # every row has the same keys, in the same order: metric_points columns
        _insert(conn, METRICS.name, tuple(rows[0]), [tuple(r.values()) for r in rows], "job_id, line")
    logs = [(job_id, g["line"], g["t"], g["stream"], g["text"]) for g in batch.get("logs", ())]
    if logs:
        _insert(conn, LOGS.name, ("job_id", "line", "t", "stream", "text"), logs, "job_id, line")
    cols = memory_columns(batch.get("memory"))
    insert_memory(conn, job_id, cols, batch.get("node") or "")
    summarise(conn, job_id, rows, cols)
    if progress is not None:  # progress only moves forward: a replayed old batch changes nothing
        step = progress["step"]
        conn.exec_driver_sql(
            PROGRESS,
            (step, progress["total_steps"], progress["percentage"], progress["eta_seconds"], job_id, step),
        )
    for s in batch.get("states", ()):
        if s["event"] == "started":
            conn.execute(update(JOBS).where(JOBS.c.id == job_id).values(trainer_pid=s.get("trainer_pid")))
        elif s["event"] == "phase":
            enter_phase(conn, job_id, s["phase"], s["t"])
        elif s["event"] == "exited":
            cancelled, cause = s.get("cancelled", False), s.get("cause")
            status = final_status(exit_code=s.get("exit_code"), cancelled=cancelled)
            more = {}
            if cancelled and not _cancel_asked(conn, job_id):
                # The runner stopped on a signal that no cancel of tunedeck's sent: its cluster or the
                # machine ended it. That is a failure, whatever the trainer saved; a warning of the
                # time limit's end is one the next attempt continues from (auto_resume).
                stop = TIME_LIMIT if s.get("time_limit") else OUTSIDE_STOP
                status, cause = JobStatus.failed, stop + (f" ({cause})" if cause else "")
                if s.get("time_limit"):
                    more["auto_resume"] = RESUME_PENDING
            finish(conn, job_id, status=status, exit_code=s.get("exit_code"), error=cause, **more)
    conn.exec_driver_sql(LAST_SEQ, (batch["seq"], job_id, batch.get("seq", -1)))


def enter_phase(conn: Connection, job_id: int, phase: str, t: float) -> None:
    """The trainer entered `phase` at `t` (runner/phases.py): kept unless a newer one is stored, so a
    batch replayed late changes nothing. A finished job keeps its last phase (README, job fields)."""
    at = datetime.fromtimestamp(t, timezone.utc)
    conn.execute(
        update(JOBS)
        .where(JOBS.c.id == job_id)
        .where(or_(JOBS.c.phase_at.is_(None), JOBS.c.phase_at <= at))
        .values(phase=phase, phase_at=at)
    )


def finish(
    conn: Connection,
    job_id: int,
    *,
    status: JobStatus,
    exit_code: int | None,
    error: str | None,
    **columns: Any,
) -> bool:
    """The runner's exit report ends its job (once: False when it had already ended)."""
    return jobstate.move(conn, job_id, status, exit_code=exit_code, error=error, **columns)


def durable(conn: Connection) -> None:
    """Commits on this connection sync the WAL to disk (the pool's default, NORMAL, syncs only at
    checkpoints): a batch is acknowledged after its commit, so an acknowledged batch survives a power
    loss. Set before the transaction begins; one fsync a group of batches."""
    conn.exec_driver_sql("PRAGMA synchronous=FULL")


@dataclass
class Stored:
    """What storing a group of batches did: each batch's error (None: stored); when the group went in
    as one transaction, the newest memory sample id before it and, if its rows are exactly the samples
    handed over, after it (`pyramid.Fresh`); and the job ends it caused, when the store runs where the
    server's JobState cannot tell them itself (the store process)."""

    errors: list[Exception | None]
    before: int | None = None
    top: int | None = None
    ended: list[Ended] = field(default_factory=list)


def store_group(state: JobState, group: list[tuple[int, dict[str, Any]]]) -> Stored:
    """Store batches in one transaction with one WAL sync, their chart tiles included; if that fails,
    each on its own, so that one bad batch fails alone."""
    try:
        with state.begin() as conn:
            durable(conn)
            fresh = pyramid.Fresh(pyramid.newest_sample(conn))
            for job_id, batch in group:
                apply_batch(conn, job_id, batch)
                fresh.add(job_id, memory_columns(batch.get("memory")), batch.get("node") or "")
            fresh.seal(conn)
            # The chart tiles of what this group stored, in its transaction, from its columns.
            pyramid.catch_up(conn, fresh)
        return Stored([None] * len(group), fresh.before, fresh.top)
    except Exception:
        errors: list[Exception | None] = []  # a full disk or a damaged file said as such (storage.fault_of)
        for job_id, batch in group:
            try:
                with state.begin() as conn:
                    durable(conn)
                    apply_batch(conn, job_id, batch)
                    pyramid.catch_up(conn)
                errors.append(None)
            except Exception as e:  # the waiting request gets the error
                errors.append(fault_of(e) or e)
        return Stored(errors)


class Store(Protocol):
    """Where the writer's groups are stored: `send` hands one over, `receive` gives the oldest one's
    `Stored`; `warm` gets ready ahead of the first, `rest` lets an idle store's resources go."""

    @property
    def pid(self) -> int | None: ...  # of its own process, while one runs

    def warm(self) -> None: ...
    def rest(self) -> None: ...
    def send(self, group: list[tuple[int, dict[str, Any]]]) -> None: ...
    def receive(self) -> Stored: ...
    def close(self) -> None: ...


class LocalStore:
    """Groups stored in the writer's own thread (the store process's fallback, and tests' writer)."""

    pid = None  # no process of its own

    def __init__(self, state: JobState):
        self.state = state
        self._done: deque[Stored] = deque()

    def warm(self) -> None:
        pass

    def rest(self) -> None:
        pass

    def send(self, group: list[tuple[int, dict[str, Any]]]) -> None:
        self._done.append(store_group(self.state, group))

    def receive(self) -> Stored:
        return self._done.popleft()

    def close(self) -> None:
        pass


class IngestWriter(Worker):
    """A thread that owns telemetry writes and commits whatever batches are waiting together.

    Its store does the writing: in this thread (`LocalStore`), or in a process of its own
    (`ingest_process.ProcessStore`, the server's). Up to AHEAD groups are at the store at once, one
    being stored and the next waiting, so the store never waits for this process; a second thread
    takes the store's answers in order, answers the requests, feeds the new samples to the alert
    detectors and tells the listeners."""

    name = "ingest-writer"
    final_pass = True  # batches handed over before stop() are stored and answered

    def __init__(
        self,
        engine: Engine,
        *,
        state: JobState | None = None,
        group_max: int = 200,
        store: Store | None = None,
        health: StorageHealth | None = None,
    ):
        super().__init__()
        self.engine = engine
        # Told of a full disk or a damaged file a group met, and of each group stored (/api/health).
        self.health = health
        self.state = state or JobState(engine)  # a runner's exit report moves its job
        self.store: Store = store if store is not None else LocalStore(self.state)
        self.group_max = group_max
        self.listeners: list[Callable[[set[int]], None]] = []  # called after each commit
        # Called after each commit, before the listeners, with the memory samples just stored.
        self.stored: list[Callable[[pyramid.Fresh], Any]] = []
        self._q: queue.Queue[tuple[int, dict[str, Any], Future]] = queue.Queue()
        # For /metrics: arrival times of batches not yet stored (FIFO, like the queue), and totals.
        self._arrived: deque[float] = deque()
        self.batches = self.items = 0
        self._window = threading.Semaphore(AHEAD)
        self._sent: queue.Queue[list[tuple[int, dict[str, Any], Future]] | None] = queue.Queue()
        self._answers: threading.Thread | None = None

    def submit(self, job_id: int, batch: dict[str, Any]) -> Future:
        fut: Future = Future()
        self._arrived.append(time.monotonic())
        self._q.put((job_id, batch, fut))
        self.wake()
        return fut

    def warm(self) -> None:
        """Get the store ready before the first batch (a runner is starting)."""
        self.store.warm()

    def start(self) -> None:
        self._answers = threading.Thread(target=self._answer_all, name=f"{self.name}-answers", daemon=True)
        self._answers.start()
        super().start()

    def stop(self) -> None:
        super().stop()  # its final pass has sent every batch handed over
        self._sent.put(None)  # and they are all answered before the store ends
        if self._answers is not None:
            self._answers.join(timeout=self.stop_timeout_s)
        self.store.close()

    def backlog(self) -> tuple[int, float]:
        """Batches received and not yet stored, and how long the oldest of them has waited (s)."""
        try:
            return len(self._arrived), time.monotonic() - self._arrived[0]
        except IndexError:
            return 0, 0.0

    def busy(self) -> bool:
        """Whether batches were received that are not yet stored and answered (hooks run)."""
        return bool(self._arrived)

    def run_once(self) -> None:
        while True:
            self._window.acquire()  # (while the store is full, the waiting batches make a bigger group)
            group = self._take()
            if not group:
                self._window.release()
                self.store.rest()  # (a store that was idle long enough lets its resources go)
                return
            try:
                self.store.send([(job_id, batch) for job_id, batch, _ in group])
            except Exception as e:  # (a batch that cannot be handed over): its requests hear why
                log.exception("ingest: a group could not be handed to the store")
                self._window.release()
                self._answer(group, Stored([e] * len(group)))
                continue
            self._sent.put(group)

    def _answer_all(self) -> None:
        while (group := self._sent.get()) is not None:
            held = True
            try:
                stored = self.store.receive()
                self._window.release()  # the store is done with it: the next group goes now, not after
                held = False  # the detectors and listeners below
                self._answer(group, stored)
            except Exception as e:  # no request is left waiting
                log.exception("ingest: answering a group failed")
                for *_, fut in group:
                    with contextlib.suppress(InvalidStateError):  # (answered before the failure)
                        fut.set_exception(e)
            finally:
                if held:
                    self._window.release()

    def _take(self) -> list[tuple[int, dict[str, Any], Future]]:
        group: list[tuple[int, dict[str, Any], Future]] = []
        while len(group) < self.group_max:
            try:
                group.append(self._q.get_nowait())
            except queue.Empty:
                break
        return group

    def _answer(self, group: list[tuple[int, dict[str, Any], Future]], stored: Stored) -> None:
        if self.health is not None:
            faults = [e for e in stored.errors if isinstance(e, StorageFault)]
            if faults:
                self.health.failed(faults[0])
            elif not any(stored.errors):
                self.health.worked()
        for (*_, fut), error in zip(group, stored.errors):
            with contextlib.suppress(InvalidStateError):  # (a future its waiter cancelled)
                if error is None:
                    fut.set_result(None)
                else:
                    fut.set_exception(error)
        if stored.before is not None:
            fresh = pyramid.Fresh(stored.before, top=stored.top)
            for job_id, batch, _ in group:
                fresh.add(job_id, memory_columns(batch.get("memory")), batch.get("node") or "")
            for hook in self.stored:
                try:
                    hook(fresh)
                except Exception:  # a hook never stops ingest
                    log.exception("ingest: a stored-samples hook failed")
        for _, batch, _ in group:
            self._arrived.popleft()
            self.items += (
                len(batch.get("metrics", ())) + len(batch.get("logs", ())) + samples(batch.get("memory"))
            )
        self.batches += len(group)
        jobs = {job_id for job_id, _, _ in group}
        for listener in self.listeners:
            try:
                listener(jobs)
            except Exception:  # a listener never stops ingest
                pass
