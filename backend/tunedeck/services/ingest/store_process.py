"""The ingest writer's store in a process of its own: inserts, chart tiles and commits off the server's GIL.

Threads of one process take turns holding the GIL, and the sqlite3 driver lets go of it for every
row it steps: in the server's process, each row the writer inserted could wait for the event loop or
the alert engine to give the GIL back (up to a switch interval, 5 ms). The child stores a group
while the writer thread answers the group before it and feeds its samples to the alert detectors,
so ingest uses the second core.

The child is `python -m tunedeck.services.ingest.store_process FD DB BUSY_S`. It reads pickled groups of
(job id, batch) from its end of a socket pair and answers each with its `Stored` once committed; job
ends it caused travel back in that answer and are told by the server's JobState. It ends when the
server's end closes (the server stopped or died: it never outlives the server), and it ignores the
SIGINT and SIGTERM that a terminal or a service manager sends to the whole process group, so the
server's final pass still finds it storing.
"""

from __future__ import annotations

import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from tunedeck.services.ingest.storage import StorageFault
from tunedeck.services.ingest.writer import Stored
from tunedeck.services.jobs.jobstate import Ended, JobState

log = logging.getLogger("tunedeck.ingest")
CLOSE_WAIT_S = 10.0
# A store process given nothing this long ends (its memory back); the next batch starts another.
IDLE_S = 300.0
CACHE_KIB = 64 * 1024
GC_THRESHOLDS = (100_000, 50, 100)


class StoreFailed(RuntimeError):
    """A batch the store process could not store (its error, as text), or the process ended first."""


class ProcessStore:
    """The writer thread's end: starts the child on first use (or `warm`), and again after it died."""

    def __init__(self, db_path: Path, state: JobState, *, busy_timeout_s: float = 30.0):
        self.db_path, self.state, self.busy_timeout_s = db_path, state, busy_timeout_s
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._sent: deque[tuple[int, Connection | None]] = deque()  # (batches, the child's end) per group
        self._lock = threading.Lock()  # warm() comes from the scheduler's thread too
        self._last = time.monotonic()  # of the last group sent

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def warm(self) -> None:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()

    def _start(self) -> None:
        if self._proc is not None:
            log.warning("ingest: the store process ended (exit code %s); starting another", self._proc.poll())
        self._last = time.monotonic()  # a child started ahead of its first group has its time to get one
        ours, theirs = socket.socketpair()
        with ours, theirs:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    __name__,
                    str(theirs.fileno()),
                    str(self.db_path),
                    repr(self.busy_timeout_s),
                ],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
            )
            self._conn = Connection(os.dup(ours.fileno()))

    def send(self, group: list[tuple[int, dict[str, Any]]]) -> None:
        self.warm()
        self._last = time.monotonic()
        data = pickle.dumps(group, protocol=pickle.HIGHEST_PROTOCOL)  # (an error here is the caller's)
        conn = self._conn
        try:
            if conn is None:
                raise OSError("no store process")
            conn.send_bytes(data)
        except OSError:
            conn = None  # the child is gone: this group fails when it is answered
        self._sent.append((len(group), conn))

    def receive(self) -> Stored:
        """The answer to the oldest group sent; its job ends told first, as a commit in this process would."""
        n, conn = self._sent.popleft()
        stored = None
        if conn is not None:
            try:
                stored = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):
                pass
            if conn is not self._conn and not any(c is conn for _, c in self._sent):
                conn.close()  # the end of a child that has since been replaced
        if stored is None:
            code = self._proc.poll() if self._proc is not None else None
            return Stored([StoreFailed(f"the ingest store process ended (exit code {code})")] * n)
        for end in stored.ended:
            try:
                self.state.ended(end)
            except Exception:  # as after a commit in this process: the store's effect stands
                log.exception("after a job change")
        return stored

    def rest(self, idle_s: float = IDLE_S) -> None:
        """End the child if it was sent nothing for `idle_s` and holds no group (called by the sending
        thread, so nothing is sent meanwhile)."""
        with self._lock:
            if self._proc is not None and not self._sent and time.monotonic() - self._last > idle_s:
                self._close()

    def close(self) -> None:
        """End the child once it has answered what it was sent (the writer's final pass is done)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=CLOSE_WAIT_S)
            except subprocess.TimeoutExpired:
                log.warning("ingest: the store process did not end; killing it")
                self._proc.kill()
                self._proc.wait()
            self._proc = None


class _Telling(JobState):
    """The child's JobState: a job's end is kept for the answer, for the server's JobState to tell."""

    def __init__(self, engine: Any):
        super().__init__(engine)
        self.ends: list[Ended] = []

    def ended(self, end: Ended) -> None:
        self.ends.append(end)


def _portable(e: Exception | None) -> Exception | None:
    # Driver errors do not all survive pickling: the request that waits gets the text (a storage
    # fault goes as it is: the server answers it 507/503, and /api/health says it).
    if e is None or isinstance(e, StorageFault):
        return e
    return StoreFailed(f"{type(e).__name__}: {e}")


def _cache(dbapi_conn: Any, _record: Any) -> None:
    # The pages that ingest touches (the newest leaves of the samples' table, of its index and of
    # every tile level) stay in memory: a fifth less CPU a row than SQLite's default 2 MB.
    dbapi_conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")


def serve(fd: int, db_path: Path, busy_timeout_s: float) -> None:
    import gc

    from sqlalchemy import event

    from tunedeck.services.ingest.writer import store_group
    from tunedeck.store.db import make_engine

    # What the store allocates is rows of numbers, made and dropped by the thousand: no cycles for the
    # collector to find. Its default (a pass every 700 new containers) cost a tenth of the store's CPU.
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)

    conn = Connection(fd)
    engine = make_engine(db_path, busy_timeout_s=busy_timeout_s)
    event.listen(engine, "connect", _cache)
    state = _Telling(engine)
    try:
        while True:
            try:
                group = pickle.loads(conn.recv_bytes())
            except EOFError:
                return
            stored = store_group(state, group)
            stored.errors = [_portable(e) for e in stored.errors]
            stored.ended, state.ends = state.ends, []
            try:
                conn.send_bytes(pickle.dumps(stored, protocol=pickle.HIGHEST_PROTOCOL))
            except OSError:
                return
    finally:
        engine.dispose()


if __name__ == "__main__":
    # Imported by its name, so that what it pickles (StoreFailed) is what the server unpickles.
    from tunedeck.services.ingest.store_process import serve as store

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    store(int(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]))
