"""Each followed job's detector state (the pure detectors of `tunedeck.alerts`), fed only the rows
stored since the last pass, read by id, or the columns the ingest writer hands it as it stores them.
reconcile.py turns what the detectors find into alert rows; engine.py is the worker that runs both."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np
from sqlalchemy import Connection, Engine, Select, bindparam, func, or_
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from tunedeck.alerts import Finding, Limits, OutOfOrder, Point, Run, Series, snapshot
from tunedeck.alerts.hardware import COLUMNS as HARDWARE
from tunedeck.checks.submission import model_config
from tunedeck.config import Settings
from tunedeck.services.alerting.reconcile import reconcile, unchanged
from tunedeck.services.charts.pyramid import Fresh
from tunedeck.services.errors import NotFound
from tunedeck.store import bulk
from tunedeck.store.tables import Alert, Job, JobStatus, LogLine, MemorySample, MetricPoint, core
from tunedeck.telemetry.base import RISE_BYTES, RISE_SHARE

log = logging.getLogger("tunedeck.alerts")
# Samples from the writer's columns a job's detectors take at most at once: a feed costs ~0.1 ms
# whatever its size, then ~0.5 µs a sample (bench/ingest_cpu.py).
SETTLE_AT = 32768
TAKE_WAIT_S = 0.1  # the writer's longest wait for the detector state (an evaluation reads it in ms)
LOG_PATTERNS = (
    "%out of memory%",
    "%OutOfMemoryError%",
    "%allocate memory%",
    "%MemoryError%",
    "%memory allocation of%",
    "%start new thread%",
    "%allocator cache flushes%",
    "%Saving model checkpoint to%",
)  # a cheap prefilter of OOM/FLUSH/SAVE (tests/alerts/test_store.py holds it to the regexes)
MEMORY, METRICS, LOGS = core(MemorySample), core(MetricPoint), core(LogLine)
TABLES = {"memory": MEMORY, "metrics": METRICS, "logs": LOGS}
CHUNK = 65536  # rows read and fed at a time
STATUS = "SELECT status FROM jobs WHERE id = ?"
SAVE = (
    "INSERT INTO alert_states (job_id, upto_memory, upto_metrics, upto_logs, state, saved_at) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (job_id) DO UPDATE SET upto_memory = excluded.upto_memory, "
    "upto_metrics = excluded.upto_metrics, upto_logs = excluded.upto_logs, state = excluded.state, "
    "saved_at = excluded.saved_at"
)
SAVED = "SELECT upto_memory, upto_metrics, upto_logs, state FROM alert_states WHERE job_id = ?"
FORGET = "DELETE FROM alert_states WHERE job_id = ?"
TOP = "SELECT " + ", ".join(f"(SELECT max(id) FROM {t.name})" for t in TABLES.values())


def limits_of(settings: Settings) -> Limits:
    return Limits(
        near_oom_share=settings.alert_near_oom_share,
        stall_min_s=settings.alert_stall_min_s,
        hold_s=settings.alert_hold_s,
    )


def job_config(job: Job) -> tuple[dict[str, Any], dict[str, Any] | None]:
    try:
        ds = json.loads(job.ds_config) if job.ds_config else None
    except ValueError:
        ds = None
    return job.config(), ds


def _loss(
    nonfinite: str | None, loss: float | None, eval_loss: float | None
) -> tuple[float | None, float | None]:
    # The columns hold finite numbers only; `nonfinite` names an inf or NaN ("inf" reads back as a float).
    bad = json.loads(nonfinite) if nonfinite else {}
    return (
        float(bad["loss"]) if "loss" in bad else loss,
        float(bad["eval_loss"]) if "eval_loss" in bad else eval_loss,
    )


def vocab_size(config: dict[str, Any], settings: Settings | None) -> int | None:
    """The model's vocabulary, from its config.json as the submit read it (inside the allowed roots,
    or the HF cache; a multimodal model's text_config holds it). None without settings (no roots)."""
    if settings is None:
        return None
    mc = model_config(config.get("model_name_or_path"), settings) or {}
    v = mc.get("vocab_size") or (mc.get("text_config") or {}).get("vocab_size")
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 1 else None


def meta_of(job: Job, settings: Settings | None = None) -> Series:
    cfg, ds = job_config(job)
    return Series(
        config=cfg,
        ds=ds,
        devices=[int(d) for d in job.devices.split(",")] if job.devices else [],
        vocab_size=vocab_size(cfg, settings),
    )


def _memory_rows(q: Select) -> Select:
    total = func.coalesce(MEMORY.c.total_bytes, 0)  # 0: unknown
    return q.add_columns(MEMORY.c.gpu, MEMORY.c.t, MEMORY.c.used_bytes, total, MEMORY.c.name, MEMORY.c.node)


FLOATS = (np.float64,) * 3  # t, used, total


def _columns(rows: list[tuple], types: tuple) -> list:
    """The rows' columns: numpy arrays of the given types, lists where the type is None."""
    n = len(rows)
    return [
        list(map(itemgetter(k), rows)) if ty is None else np.fromiter(map(itemgetter(k), rows), ty, n)
        for k, ty in enumerate(types)
    ]


def _metric_rows(q: Select) -> Select:
    return q.add_columns(
        METRICS.c.line,
        METRICS.c.t,
        METRICS.c.step,
        METRICS.c.loss,
        METRICS.c.eval_loss,
        METRICS.c.nonfinite,
        METRICS.c.throughput,
        METRICS.c.grad_norm,
        METRICS.c.lr,
    )


def _hardware_rows(q: Select) -> Select:
    """The samples that carry a hardware reading (CPU jobs' have none: nothing comes back for them)."""
    cols = [MEMORY.c[k] for k in HARDWARE]
    return q.add_columns(MEMORY.c.node, MEMORY.c.gpu, MEMORY.c.t, *cols).where(
        or_(*(c.is_not(None) for c in cols))
    )


def _feed_hardware(jobs: dict[int, _Followed], rows: list, job_id: int | None = None) -> None:
    """Rows (id, job_id, node, gpu, t, *HARDWARE) to each job's hardware detectors, device by device
    in the order given; with `job_id`, rows (id, node, gpu, t, ...) of that job."""
    by: dict[tuple[int, str, int], list] = {}
    for r in rows:
        if job_id is not None:
            r = (r[0], job_id, *r[1:])
        by.setdefault((r[1], r[2], r[3]), []).append(r)
    for (job, node, gpu), part in by.items():
        st = jobs.get(job)
        if st is not None:
            cols = {k: [r[5 + i] for r in part] for i, k in enumerate(HARDWARE)}
            st.run.feed_hardware(gpu, [r[4] for r in part], cols, node)


def _log_rows(q: Select) -> Select:
    return q.add_columns(LOGS.c.line, LOGS.c.t, LOGS.c.text).where(
        or_(*(LOGS.c.text.like(x) for x in LOG_PATTERNS))
    )


class _Followed:
    """A job's detector state and where in its stored series it stands."""

    __slots__ = (
        "fresh",
        "last_used",
        "line",
        "log_line",
        "pending",
        "queued",
        "risen",
        "run",
        "said",
        "saved",
        "tracked",
        "upto",
    )

    def __init__(self, run: Run, upto: dict[str, int]):
        self.run, self.upto = run, upto  # upto: the last id of each table already fed
        self.line = self.log_line = -1  # the last metric and log line fed
        self.fresh = False  # fed memory samples or metric points since its last evaluation
        self.said: list[Finding] | None = None  # the findings last stored (the job's alerts change only here)
        self.tracked: dict[tuple[str, str, int | None], float] = {}  # reconcile's, for `unchanged`
        self.last_used: dict[tuple[str, int], float] = {}  # each device's last sample
        # Fed a sample well above the one before it, or at the near-OOM share of its device, since its
        # last evaluation: judged at once (the engine's interval holds back everything else).
        self.risen = False
        # Memory samples taken from the writer's columns and not yet handed to the detectors, which
        # cost less a sample in bigger chunks: (node, gpu, t, used, total, names) of each batch.
        self.pending: list[tuple] = []
        self.queued = 0  # samples in `pending`
        self.saved = time.monotonic()  # when its state was last saved, or built (`Tracker.save`)


class Tracker:
    """The detector state of the jobs under watch. A job's state is built from its stored series
    the first time it is evaluated (after a server start, or when it was dropped); from then on each
    pass reads only the rows stored since the last one, by id over all jobs, and feeds them."""

    def __init__(self, engine: Engine, limits: Limits, settings: Settings | None = None):
        self.engine, self.limits = engine, limits
        self.settings = settings  # where a job's model config may be read (meta_of); None: not read
        # The engine's thread judges; the ingest writer's thread feeds what it just stored (`take`).
        self.lock = threading.RLock()
        self.jobs: dict[int, _Followed] = {}
        self.seen: dict[str, int] | None = None  # the last id of each table read
        self.rows = 0  # series rows read so far (for the scaling benchmark and tests)
        # Memory samples fed to the detectors from the writer's columns, and from rows read back.
        self.fed = {"columns": 0, "rows": 0}
        self._sql: dict[str, tuple[str, list[str], dict]] = {}
        # Whether the ingest writer has batches in hand: their samples come through `take`.
        self.busy: Callable[[], bool] = lambda: False

    def fresh(self, job_id: int) -> bool:
        """Whether the job was fed memory samples or metric points since its last evaluation."""
        st = self.jobs.get(job_id)
        return st is not None and st.fresh

    def risen(self, job_id: int) -> bool:
        """Whether the job was fed a sample well above the one before it, or at the near-OOM share of
        its device, since its last evaluation."""
        st = self.jobs.get(job_id)
        return st is not None and st.risen

    @staticmethod
    def _top(conn: Connection) -> dict[str, int]:
        row = conn.exec_driver_sql(TOP).one()  # (read on every pass: one statement, plain SQL)
        return {k: v or 0 for k, v in zip(TABLES, row)}

    def pull(self) -> None:
        """Feed the followed jobs the rows stored since the last pass. While the ingest writer has
        batches in hand (`busy`), the memory samples are left to its `take`s, which feed them from its
        columns: a pass here would read back rows stored a moment before their take."""
        with self.lock, self.engine.connect() as conn:
            top = self._top(conn)
            if self.seen is not None and self.busy():
                top["memory"] = self.seen["memory"]
            if self.seen is not None and self.jobs:
                self._feed(conn, self.seen, top)
            # Never past the newest id: when the newest rows were deleted (retention) their ids are handed out again.
            self.seen = top

    def take(self, fresh: Fresh) -> bool:
        """Feed the memory samples a commit just stored from the writer's own columns, in its thread:
        no read back, and no second thread taking turns with the writer for each row. Rows stored
        before them and not yet fed (a batch stored on its own, a take that found the state busy) are
        read back first; a batch a pass already read is skipped. Waits at most TAKE_WAIT_S for the
        engine to read its findings (a state being built takes longer). True: fed from the columns;
        False: from the stored rows, or left to the next take or pass."""
        if not self.lock.acquire(timeout=TAKE_WAIT_S):
            return False
        try:
            if self.seen is None:  # nothing followed yet: the first pass reads from the newest row
                return False
            if fresh.top is None:  # not exactly the samples handed over (a resend): read what is new
                self._read_memory()
                return False
            if self.seen["memory"] < fresh.before:
                self._read_memory(fresh.before)
            first = fresh.before + 1  # the rows hold ids before + 1 ... top, in insert order
            for job_id, node, cols in fresh.batches:
                last = first + len(cols["line"]) - 1
                st = self.jobs.get(job_id)
                # Not if a pass or a state built since read it (a reader sees whole transactions).
                if st is not None and max(self.seen["memory"], st.upto["memory"]) < first:
                    self._queue(st, job_id, node, cols)
                first = last + 1
            self.seen["memory"] = max(self.seen["memory"], fresh.top)
            for st in self.jobs.values():
                st.upto["memory"] = max(st.upto["memory"], self.seen["memory"])
            return True
        finally:
            self.lock.release()

    def _read_memory(self, through: int | None = None) -> None:
        """Feed the memory samples stored after the last one fed, through the id given (the newest)."""
        assert self.seen is not None
        with self.engine.connect() as conn:
            if through is None:
                through = conn.execute(select(func.max(MEMORY.c.id))).scalar() or 0
            if through > self.seen["memory"] and self.jobs:
                self._feed(conn, self.seen, {**self.seen, "memory": through})
            self.seen["memory"] = max(self.seen["memory"], through)

    def _queue(self, st: _Followed, job_id: int, node: str, cols: dict[str, Any]) -> None:
        """One batch's samples, as stored, for the detectors' next `settle`; their rises noted now (a
        spike's first sample is judged at once)."""
        gpu = np.asarray(cols["gpu"])
        used = np.asarray(cols["used_bytes"], dtype=np.float64)
        total = cols.get("total_bytes")
        tot = np.zeros(len(used)) if total is None else np.array([x or 0 for x in total], dtype=np.float64)
        self._rises(st, node, gpu, used, tot)
        st.fresh = True
        st.run.hardware.feed_columns(node, cols)
        st.pending.append((node, gpu, np.asarray(cols["t"], dtype=np.float64), used, tot, cols.get("name")))
        st.queued += len(used)
        if st.queued >= SETTLE_AT:
            self._settle(job_id, st)

    def settle(self, job_id: int | None = None) -> None:
        """Hand the detectors of a job (None: of every job) the samples taken and not yet fed."""
        with self.lock:
            for j in [job_id] if job_id is not None else list(self.jobs):
                st = self.jobs.get(j)
                if st is not None:
                    self._settle(j, st)

    def _settle(self, job_id: int, st: _Followed) -> None:
        """The pending samples, node by node and device by device in the order they came."""
        pending, st.pending, st.queued = st.pending, [], 0
        for node in dict.fromkeys(p[0] for p in pending):
            parts = [p for p in pending if p[0] == node]
            gpu, t, used, tot = (np.concatenate(c) for c in list(zip(*parts))[1:5])
            names = list(chain.from_iterable(p[5] or [None] * len(p[1]) for p in parts))
            for g in dict.fromkeys(gpu.tolist()):
                at = np.flatnonzero(gpu == g)
                self._device(st, job_id, g, t[at], used[at], tot[at], names[at[-1]], node)
                if job_id not in self.jobs:  # out of order: it is built again from the stored series
                    return
                self.fed["columns"] += len(at)

    def _rows(self, conn: Connection, shape: str, query: Callable[[], Select], **values):
        """The rows of `query` (compiled once per `shape`, its bind parameters from `values`), straight
        from the driver's cursor: plain tuples, not Row objects, which cost three times the read
        itself on the ingest path (every stored sample passes through here once)."""
        if shape not in self._sql:
            c = query().compile(dialect=conn.dialect)
            self._sql[shape] = (str(c), list(c.positiontup or ()), dict(c.params))
        sql, names, fixed = self._sql[shape]
        cur = bulk.driver_cursor(conn)
        try:
            cur.execute(sql, [values[k] if k in values else fixed[k] for k in names])
            while part := cur.fetchmany(CHUNK):
                self.rows += len(part)
                yield part
        finally:
            cur.close()

    def _feed(self, conn: Connection, lo: dict[str, int], hi: dict[str, int]) -> None:
        def new(name: str) -> Select:
            t = TABLES[name]
            q = select(t.c.id, t.c.job_id).where(t.c.id > bindparam("lo"), t.c.id <= bindparam("hi"))
            return q.order_by(t.c.id)

        def fetch(name: str, query: Callable[[Select], Select]):
            table = (
                "memory" if name == "hardware" else name
            )  # the hardware readings are memory samples' columns
            if hi[table] <= lo[table]:  # nothing new (most passes, for most tables): no query
                return iter(())
            return self._rows(conn, f"new {name}", lambda: query(new(table)), lo=lo[table], hi=hi[table])

        for part in fetch("memory", _memory_rows):  # rows: id, job_id, gpu, t, used, total, name, node
            self._memory_part(*_columns(part, (np.int64, np.int64, np.int64, *FLOATS, None, None)))
        for part in fetch("hardware", _hardware_rows):
            _feed_hardware(
                self.jobs, [r for r in part if (st := self.jobs.get(r[1])) and r[0] > st.upto["memory"]]
            )
        for part in fetch("metrics", _metric_rows):
            for job_id, rows in _by_job(part, self.jobs, "metrics").items():
                self._points(job_id, rows)
        for part in fetch("logs", _log_rows):
            for job_id, rows in _by_job(part, self.jobs, "logs").items():
                self._logs(job_id, rows)
        for st in self.jobs.values():  # (a state built since the last pass may stand further)
            st.upto = {k: max(v, st.upto[k]) for k, v in hi.items()}

    def _memory_part(self, ids, jobs, gpus, t, used, total, names, nodes, building: int = 0) -> None:
        """Rows of memory samples, as columns, fed by device with numpy (a Python step a row costs more
        than the detectors): new rows in id order, or (jobs None) all the rows of the job `building`."""
        keys = [gpus]
        if len(set(nodes)) > 1:
            keys.append(np.unique(np.asarray(nodes), return_inverse=True)[1])
        if jobs is not None:
            keys.append(jobs)
        order = np.lexsort(keys)  # by job, node, device; in id order within each (a stable sort)
        cut = np.flatnonzero(np.any([np.diff(k[order]) != 0 for k in keys], axis=0)) + 1
        for sel in np.split(order, cut):
            i = int(sel[0])
            job_id = building if jobs is None else int(jobs[i])
            st = self.jobs.get(job_id)
            if st is None:
                continue
            if jobs is not None:  # a job built since the last pass has the rows up to where it was built
                sel = sel[np.searchsorted(ids[sel], st.upto["memory"], side="right") :]
                if not len(sel):
                    continue
            self._memory(st, job_id, int(gpus[i]), t[sel], used[sel], total[sel], names[sel[-1]], nodes[i])
            self.fed["rows"] += len(sel)

    def _memory(
        self, st: _Followed, job_id: int, gpu: int, t, used, total, name: str | None, node: str
    ) -> None:
        if st.pending:  # (taken samples are older than any row read after them)
            self._settle(job_id, st)
            if job_id not in self.jobs:
                return
        self._rises(st, node, np.full(len(used), gpu), used, np.asarray(total, dtype=np.float64))
        self._device(st, job_id, gpu, t, used, total, name, node)

    def _rises(self, st: _Followed, node: str, gpu: np.ndarray, used: np.ndarray, total: np.ndarray) -> None:
        """Note whether any sample is well above the one before it on its device or at the near-OOM
        share of its device, and each device's last."""
        if not len(used):
            return
        order = np.argsort(gpu, kind="stable")
        g, u = gpu[order], used[order]
        start = np.ones(len(g), dtype=bool)
        start[1:] = g[1:] != g[:-1]
        before = np.empty(len(u))
        before[1:] = u[:-1]
        before[start] = [st.last_used.get((node, int(x)), np.nan) for x in g[start]]  # NaN: none yet
        floor = np.maximum(RISE_BYTES, RISE_SHARE * total[order])
        with np.errstate(invalid="ignore"):
            near = (total > 0) & (used >= self.limits.near_oom_share * total)
            st.risen = st.risen or bool(np.any(u - before >= floor)) or bool(near.any())
        last = np.r_[start[1:], True]
        for x, v in zip(g[last].tolist(), u[last].tolist()):
            st.last_used[(node, x)] = v

    def _device(
        self, st: _Followed, job_id: int, gpu: int, t, used, total, name: str | None, node: str
    ) -> None:
        st.fresh = True
        try:
            st.run.feed_memory(gpu, t, used, total, node)
        except OutOfOrder:  # a replayed batch stored late: built again from the stored series
            log.info("alerts: job %s got memory samples out of order; rebuilding its state", job_id)
            del self.jobs[job_id]
            return
        if name:
            st.run.meta.gpu_names[gpu] = name

    def _points(self, job_id: int, rows: list) -> None:
        st = self.jobs.get(job_id)
        if st is None:
            return
        if rows[0][2] <= st.line:
            del self.jobs[job_id]
            return
        st.line, st.fresh = rows[-1][2], True
        st.run.feed_points(Point(r[3], r[4], *_loss(r[7], r[5], r[6]), r[8], r[9], r[10]) for r in rows)

    def _logs(self, job_id: int, rows: list) -> None:
        st = self.jobs.get(job_id)
        if st is None:
            return
        if rows[0][2] <= st.log_line:
            del self.jobs[job_id]
            return
        st.log_line = rows[-1][2]
        st.run.feed_logs((r[3], r[4]) for r in rows)

    def build(self, job: Job) -> _Followed:
        """A job's state: its saved one and the rows stored after it (`save`), or else all of its
        stored series."""
        return self._resume(job) or self._build(job, None)

    def _build(self, job: Job, saved: tuple[Run, dict[str, int], dict[str, Any]] | None) -> _Followed:
        """From the saved (state, the newest rows it was fed, the rest of what was followed), the rows
        stored after those; without one, from all of the job's stored series."""
        with self.engine.connect() as conn:
            top = self._top(conn)
            lo = dict.fromkeys(TABLES, 0) if saved is None else saved[1]
            run = Run(meta_of(job, self.settings), self.limits) if saved is None else saved[0]
            st = self.jobs[job.id] = _Followed(run, top)
            if saved is not None:
                st.line, st.log_line, st.last_used = (
                    saved[2]["line"],
                    saved[2]["log_line"],
                    saved[2]["last_used"],
                )

            def of(name: str) -> Select:
                t = TABLES[name]
                return select(t.c.id).where(
                    t.c.job_id == bindparam("job"), t.c.id > bindparam("lo"), t.c.id <= bindparam("top")
                )

            def fetch(name: str, query: Callable[[], Select]):
                return self._rows(conn, f"all {name}", query, job=job.id, lo=lo[name], top=top[name])

            q = lambda: _memory_rows(of("memory")).order_by(  # the key's order: no sort
                MEMORY.c.node, MEMORY.c.gpu, MEMORY.c.t, MEMORY.c.line, MEMORY.c.id
            )
            for part in fetch("memory", q):  # rows: id, gpu, t, used, total, name, node
                ids, gpus, t, used, total, names, nodes = _columns(
                    part, (np.int64, np.int64, *FLOATS, None, None)
                )
                self._memory_part(ids, None, gpus, t, used, total, names, nodes, building=job.id)
            q = lambda: _hardware_rows(of("memory")).order_by(
                MEMORY.c.node, MEMORY.c.gpu, MEMORY.c.t, MEMORY.c.line
            )
            for part in self._rows(conn, "all hardware", q, job=job.id, lo=lo["memory"], top=top["memory"]):
                _feed_hardware(self.jobs, part, job.id)
            for part in fetch("metrics", lambda: _metric_rows(of("metrics")).order_by(METRICS.c.line)):
                self._points(job.id, [(None, None, *r[1:]) for r in part])
            for part in fetch("logs", lambda: _log_rows(of("logs")).order_by(LOGS.c.line)):
                self._logs(job.id, [(None, None, *r[1:]) for r in part])
        return st

    def _resume(self, job: Job) -> _Followed | None:
        """The job's saved state brought up to date, or None: none saved, saved by other detector code
        or settings, or rows stored since that it cannot take (a late batch older than its samples)."""
        with self.engine.connect() as conn:
            row = conn.exec_driver_sql(SAVED, (job.id,)).one_or_none()
        if row is None:
            return None
        try:
            saved = snapshot.load(row[3])
            run = saved["run"]
            if not isinstance(run, Run):
                raise snapshot.BadSnapshot("not a Run")
            meta = meta_of(job, self.settings)
            if run.limits != self.limits or (run.meta.config, run.meta.ds, run.meta.vocab_size) != (
                meta.config,
                meta.ds,
                meta.vocab_size,
            ):
                raise snapshot.Stale("saved under other alert settings or another model config")
            upto = {"memory": row[0], "metrics": row[1], "logs": row[2]}
            st = self._build(job, (run, upto, saved))
        except (snapshot.BadSnapshot, KeyError, TypeError) as e:
            log.info("alerts: job %s's saved state is not used (%s): built from its series", job.id, e)
            st = None
        if st is None or job.id not in self.jobs:  # (a late batch older than its samples: dropped)
            self.jobs.pop(job.id, None)
            self.forget(job.id)
            return None
        return st

    def save(self, job_id: int) -> bool:
        """Save a followed job's detector state with the newest rows it was fed (`alert_states`): a
        restarted server resumes it from there (`build`). False: not followed, or deleted."""
        with self.lock:
            st = self.jobs.get(job_id)
            if st is None:
                return False
            self._settle(job_id, st)
            if job_id not in self.jobs:
                return False
            state = {"run": st.run, "line": st.line, "log_line": st.log_line, "last_used": st.last_used}
            blob, upto = snapshot.dump(state), dict(st.upto)
            st.saved = time.monotonic()
        try:
            with self.engine.begin() as conn:
                conn.exec_driver_sql(
                    SAVE, (job_id, upto["memory"], upto["metrics"], upto["logs"], blob, time.time())
                )
        except IntegrityError:  # the job was deleted meanwhile
            return False
        return True

    def due(self, every_s: float) -> list[int]:
        """The followed jobs whose state was last saved (or built) at least `every_s` ago, oldest first."""
        now = time.monotonic()
        with self.lock:
            old = [(st.saved, j) for j, st in self.jobs.items() if now - st.saved >= every_s]
        return [j for _, j in sorted(old)]

    def forget(self, job_id: int) -> None:
        """Drop a job's saved state (it ended, or the state cannot be used)."""
        with self.engine.begin() as conn:
            conn.exec_driver_sql(FORGET, (job_id,))

    def evaluate(
        self,
        job_id: int,
        *,
        now: float | None = None,
        on_new: Callable[[Job, list[Alert]], None] | None = None,
        on_closed: Callable[[set[int]], None] | None = None,
    ) -> list[Alert]:
        """Bring the job's state up to date and store what it finds; returns the alerts opened now.
        `on_closed` hears of the job when any of its alerts closed or changed (after the commit). The
        state is held only while the findings are read from it: the writer feeds it while they are stored."""
        with self.engine.connect() as conn:  # (no session and no ORM object when nothing is stored)
            status = conn.exec_driver_sql(STATUS, (job_id,)).scalar()
        with self.lock:
            if status is None:  # deleted: nothing more to follow
                self.jobs.pop(job_id, None)
                raise NotFound(f"job {job_id} not found")
            status = JobStatus(status)
            self.pull()
            if job_id in self.jobs:
                self._settle(job_id, self.jobs[job_id])
            st = self.jobs.get(job_id)
            if st is None:
                with Session(self.engine) as session:
                    job = session.get(Job, job_id)
                    if job is None:
                        raise NotFound(f"job {job_id} not found")
                    st = self.build(job)
            st.fresh = st.risen = False
            running = status == JobStatus.running
            findings = st.run.findings(running=running, now=(now or time.time()) if running else None)
        if not status.finished and unchanged(findings, st.said, st.tracked):
            st.said = findings  # stored as they are (but for ends not yet due): nothing to do
            return []
        with Session(self.engine) as session:
            job = session.get(Job, job_id)
            if job is None:  # deleted meanwhile
                with self.lock:
                    self.jobs.pop(job_id, None)
                raise NotFound(f"job {job_id} not found")
            moved: list[Alert] = []  # closed or changed: the job's open pages read its alerts again
            new = reconcile(
                session,
                job_id,
                findings,
                finished=status.finished,
                closed=moved,
                changed=moved,
                tracked=st.tracked,
                said=st.said,
            )
            st.said = findings
            if status.finished:  # nothing more comes; a late row builds it again
                with self.lock:
                    self.jobs.pop(job_id, None)
                self.forget(job_id)
            if new and on_new:
                on_new(job, new)
            if moved and on_closed:
                on_closed({job_id})
            return new


def _by_job(part, jobs: dict[int, _Followed], table: str) -> dict[int, list]:
    by: dict[int, list] = {}
    for r in part:
        st = jobs.get(r[1])
        if st is not None and r[0] > st.upto[table]:
            by.setdefault(r[1], []).append(r)
    return by
