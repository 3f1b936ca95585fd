"""A run from outside tunedeck stored as a finished job: its points, memory samples and alerts.

The files come as uploads spooled to disk. Each is copied into a fresh folder while it is hashed and
checked to be UTF-8, then read from there line by line, so a long run never sits in memory as one
text. The hashes, with the job's name and owner, are the job's import key: the same import sent
again (a retry after an answer that never came) gets the job the first one made, not a second one.
"""

from __future__ import annotations

import codecs
import errno
import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import BinaryIO

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, select

from tunedeck.alerts import Series, analyze
from tunedeck.alerts.rundir import BadInput, build
from tunedeck.alerts.training import OOM
from tunedeck.config import Settings
from tunedeck.contract import runfiles
from tunedeck.contract.output import clean
from tunedeck.services.alerting import reconcile as alert_service
from tunedeck.services.alerting.tracker import limits_of
from tunedeck.services.charts import pyramid
from tunedeck.services.ingest.writer import apply_batch
from tunedeck.services.jobs.jobstate import JobState, after_commit, move
from tunedeck.services.jobs.records import slug
from tunedeck.store.tables import Job, JobStatus

# Each upload field and where the run folder keeps it (as a launched job's folder would).
FILES = {
    "trainer_log": f"{runfiles.OUTPUT}/{runfiles.TRAINER_LOG}",
    "memory": runfiles.MEMORY_CSV,
    "config": runfiles.TRAIN_YAML,
    "log": runfiles.TRAIN_LOG,
}
CHUNK = 1 << 20
METRICS_PER_BATCH = 5_000  # trainer_log lines stored per batch: the rows one batch holds in memory
LOG_LINES_PER_BATCH = 5_000  # output lines stored per insert
WALL_CLOCK = 1e9  # 2001-09-09 as a Unix time: a run's times below it count from its start, not a date
MAX_LOG_LINE = 65_536  # characters of one output line kept, as a runner's batch may carry (protocol.LogIn)


class BadUpload(BadInput):
    """An upload that is not what its field holds; `field` names it."""

    def __init__(self, field: str, msg: str):
        super().__init__(msg)
        self.field = field


def import_run(
    engine: Engine,
    *,
    settings: Settings,
    name: str,
    files: dict[str, BinaryIO | None],
    owner: str | None = None,
    state: JobState | None = None,
) -> tuple[Job, bool]:
    """The job of this import (`files` by field, as FILES names them) and whether it is new: the same
    files, name and owner imported before give that job back. A new one is moved to its end as a
    launched job ends (webhooks included)."""
    state = state or JobState(engine)
    settings.runs_dir.mkdir(parents=True, exist_ok=True)
    # Fresh and private: nothing in it can be a link planted to be written through.
    staging = Path(tempfile.mkdtemp(prefix=".import-", dir=settings.runs_dir))
    try:
        digests = _stage(staging, files)
        key = import_key(name=name, owner=owner, digests=digests)
        with _one_at_a_time(key):  # a retry while the first is still storing waits for its job
            if (job := _imported(engine, key)) is not None:
                return job, False
            try:
                return _store(
                    engine, state, settings=settings, name=name, owner=owner, key=key, staging=staging
                ), True
            except IntegrityError:  # another server process stored the same import meanwhile
                if (job := _imported(engine, key)) is None:
                    raise
                return job, False
    finally:
        shutil.rmtree(staging, ignore_errors=True)  # gone already where it became the run folder


def import_key(*, name: str, owner: str | None, digests: dict[str, str | None]) -> str:
    """One hash of what makes two imports the same: the files' hashes, the job's name and owner."""
    what = json.dumps({"name": name, "owner": owner, "files": digests}, sort_keys=True)
    return hashlib.sha256(what.encode()).hexdigest()


def _stage(folder: Path, files: dict[str, BinaryIO | None]) -> dict[str, str | None]:
    """Copy each upload into `folder` as it streams, checking it is UTF-8 text; the sha256 of each
    (None: absent or empty; an empty optional file is left out, as if not sent)."""
    digests: dict[str, str | None] = {}
    for field, rel in FILES.items():
        digests[field] = None
        src = files.get(field)
        if src is None:
            continue
        target = folder / rel
        target.parent.mkdir(exist_ok=True)
        h, text, size = hashlib.sha256(), codecs.getincrementaldecoder("utf-8")(), 0
        with open(target, "xb") as dest:
            while chunk := src.read(CHUNK):
                try:
                    text.decode(chunk)
                except UnicodeDecodeError:
                    raise BadUpload(field, "not UTF-8 text") from None
                h.update(chunk)
                size += dest.write(chunk)
        try:
            text.decode(b"", final=True)
        except UnicodeDecodeError:
            raise BadUpload(field, "not UTF-8 text (it ends inside a character)") from None
        if size or field == "trainer_log":  # the log is required: an empty one is refused when read
            digests[field] = h.hexdigest()
        else:
            target.unlink()
    return digests


def _imported(engine: Engine, key: str) -> Job | None:
    with Session(engine) as s:
        job = s.exec(select(Job).where(Job.import_key == key)).first()
        if job is not None:
            s.expunge(job)
        return job


_keys: dict[str, tuple[threading.Lock, int]] = {}  # import key: its lock, and how many hold or wait
_keys_lock = threading.Lock()


@contextmanager
def _one_at_a_time(key: str) -> Iterator[None]:
    with _keys_lock:
        lock, n = _keys.get(key, (threading.Lock(), 0))
        _keys[key] = (lock, n + 1)
    try:
        with lock:
            yield
    finally:
        with _keys_lock:
            n = _keys[key][1] - 1
            if n:
                _keys[key] = (lock, n)
            else:
                del _keys[key]


def _place(staging: Path, runs: Path, base: str) -> Path:
    """The staged files moved to the job's run folder. A folder already there (one a deleted job kept,
    whose id came back) is never written into, whatever its files link to: the next free name is taken."""
    for n in range(1, 1000):
        run_dir = runs / (base if n == 1 else f"{base}-{n}")
        try:
            os.rename(staging, run_dir)  # atomic; refuses a link, a file or a folder that holds anything
            return run_dir
        except OSError as e:
            if e.errno not in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR):
                raise
    raise FileExistsError(f"no free run folder name for {base} in {runs}")


def _store(
    engine: Engine,
    state: JobState,
    *,
    settings: Settings,
    name: str,
    owner: str | None,
    key: str,
    staging: Path,
) -> Job:
    """Store the staged run, then move the job to its end."""
    with ExitStack() as opened:

        def read(field: str, **kw) -> Iterator[str] | None:
            path = staging / FILES[field]
            return opened.enter_context(open(path, encoding="utf-8", **kw)) if path.exists() else None

        config_path = staging / FILES["config"]
        config = config_path.read_text() if config_path.exists() else None
        series, lines = build(
            trainer_log=read("trainer_log") or "",
            memory_csv=read("memory", newline=""),
            config=config,
            log_text=read("log"),
        )
    start, end = _dated(series, lines, time.time())
    findings = analyze(series, limits_of(settings))  # the same engine as live ingest
    run_dir: Path | None = None
    try:
        # One transaction: all of the run or nothing, and nobody sees the job before it has ended.
        with state.begin() as conn, Session(bind=conn) as s:
            job = Job(
                name=name,
                owner=owner,
                gpus=len(series.devices),
                spec=json.dumps({"name": name, "config": series.config, "imported": True}),
                train_yaml=config or "",
                devices=",".join(map(str, series.devices)) or None,
                import_key=key,
            )
            s.add(job)
            s.flush()
            # A run folder like a launched job's (never "": an empty path would mean the server's cwd).
            run_dir = _place(staging, settings.runs_dir, f"{job.id:06d}-{slug(name)}")
            job.run_dir, job.output_dir = str(run_dir), str(runfiles.output_dir(run_dir))
            s.flush()
            _store_series(conn, job.id, series, lines, log=run_dir / FILES["log"])
            new = alert_service.reconcile(
                s, job.id, findings, finished=True
            )  # the run is over: stored closed
            if (
                state.notifier is not None
            ):  # the team hears of an imported run as of a live one: its alerts, then its end
                notifier = state.notifier
                after_commit(conn, lambda: notifier.alerts_opened(job, new))
            move(conn, job.id, JobStatus.running, started_at=_utc(start))
            if oom := _out_of_memory(
                series.logs
            ):  # a run that died of OOM did not succeed, whatever it logged before
                move(
                    conn, job.id, JobStatus.failed, error=f"out of memory: {oom[:500]}", finished_at=_utc(end)
                )
            else:
                move(conn, job.id, JobStatus.succeeded, exit_code=0, finished_at=_utc(end))
            s.refresh(job)
            s.expunge(job)
    except BaseException:
        if run_dir is not None:  # nothing of a run that was not stored stays behind
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return job


def _dated(series: Series, lines: list[dict], now: float) -> tuple[float, float]:
    """The run's start and end, from its own times. Files that carry wall-clock times (a memory CSV,
    trainer_log lines with `t`) date it; times that count from 0 (only trainer_log's elapsed_time) are
    moved, every one alike, to end at `now`: the run is dated by its import then, its durations kept,
    and its charts do not start on 1 January 1970."""
    times = [p.t for p in series.points] + [t for xs in series.memory.values() for t, _, _ in xs]
    if not times:
        return now, now
    start, end = min(times), max(times)
    if end >= WALL_CLOCK:
        return start, end
    shift = now - end
    series.points = [replace(p, t=p.t + shift) for p in series.points]
    series.memory = {k: [(t + shift, u, total) for t, u, total in xs] for k, xs in series.memory.items()}
    series.logs = [(t + shift, text) for t, text in series.logs]
    for line in lines:
        line["t"] += shift
    return start + shift, now


def _utc(t: float) -> datetime:
    return datetime.fromtimestamp(t, timezone.utc)


def _store_series(conn, job_id: int, series, lines: list[dict], *, log: Path) -> None:
    """The run's samples, output and points as its runners would have sent them, and its chart tiles."""
    by_node: dict[str, list] = {}  # one batch per node, as its runner would have sent
    for key, xs in series.memory.items():
        node, gpu = key if isinstance(key, tuple) else ("", key)
        by_node.setdefault(node, []).extend((gpu, t, u, tot) for t, u, tot in xs)
    for node, samples in sorted(by_node.items())[1:]:
        samples.sort(key=lambda x: x[:2])
        memory = [
            {"line": i, "t": t, "gpu": gpu, "used_bytes": used, "total_bytes": total}
            for i, (gpu, t, used, total) in enumerate(samples)
        ]
        apply_batch(conn, job_id, {"seq": 0, "node": node, "memory": memory})
    node, samples = min(by_node.items()) if by_node else ("", [])
    samples.sort(key=lambda x: x[:2])
    apply_batch(
        conn,
        job_id,
        {
            "node": node,
            "seq": 0,
            "memory": [
                {"line": i, "t": t, "gpu": gpu, "used_bytes": used, "total_bytes": total}
                for i, (gpu, t, used, total) in enumerate(samples)
            ],
        },
    )
    if log.exists():
        _store_log(conn, job_id, log, node=node, t=_end(series))
    for start in range(0, len(lines), METRICS_PER_BATCH):  # in order: each batch paces from the first point
        chunk = lines[start : start + METRICS_PER_BATCH]
        metrics = [{"line": start + i, "t": x["t"], "raw": x["raw"]} for i, x in enumerate(chunk)]
        apply_batch(conn, job_id, {"node": node, "seq": 0, "metrics": metrics})
    pyramid.catch_up(conn)  # its chart tiles, in the same transaction


def _end(series) -> float:
    """When the run ended, as near as its files say: its last point or memory sample (output lines
    carry no time of their own)."""
    times = [p.t for p in series.points[-1:]] + [xs[-1][0] for xs in series.memory.values() if xs]
    return max(times, default=0.0)


def _store_log(conn, job_id: int, path: Path, *, node: str, t: float) -> None:
    """Every line of the run's output, cleaned as a runner cleans what it reads (progress-bar
    redraws collapse, escapes go), numbered in order and stored LOG_LINES_PER_BATCH at a time."""
    batch: list[dict] = []
    n = 0
    with open(path, encoding="utf-8", newline="\n") as f:  # a lone \r is a redraw, not a line
        for raw in f:
            if not (text := clean(raw)[:MAX_LOG_LINE]):
                continue
            batch.append({"line": n, "t": t, "stream": "stdout", "text": text})
            n += 1
            if len(batch) == LOG_LINES_PER_BATCH:
                apply_batch(conn, job_id, {"node": node, "seq": 0, "logs": batch})
                batch = []
    if batch:
        apply_batch(conn, job_id, {"node": node, "seq": 0, "logs": batch})


def _out_of_memory(logs: list[tuple[float, str]]) -> str | None:
    """The last out-of-memory line of the run's log, if it has one."""
    return next((text.strip() for _, text in reversed(logs) if OOM.search(text)), None)
