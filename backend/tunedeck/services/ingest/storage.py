"""Storage faults told apart from other errors: a full disk, a read-only workspace, a damaged database.

A request that meets one is answered 507 (full) or 503 with the reason and `Retry-After`, never a
bare 500. Nothing acknowledged is lost: a batch is acknowledged after its commit, and a commit that
fails is rolled back whole, so the runner keeps the batch in its outbox and sends it again.
The server remembers the newest fault for `/api/health` ("degraded" and why) until a write succeeds
again or, for a full disk or a read-only workspace, until the database's folder takes a probe file
again; a damaged database stays "degraded" until the server starts again on a restored file.
Reasons name no paths (`/api/health` answers anyone).
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time
from pathlib import Path

from tunedeck.store.db import RESTORE_HINT, damage_marker, quick_check
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.services.ingest.storage")

RETRY_AFTER_S = 30
PROBE_BYTES = 1 << 20  # what the folder must take again before a full disk counts as having room

FULL, READ_ONLY, DAMAGED, IO = "full", "read-only", "damaged", "i/o"
WHY = {
    FULL: "the disk holding the database is full ({text}): free space; runners keep their telemetry "
    "in their outboxes meanwhile",
    READ_ONLY: "the database cannot be written ({text}): the workspace is read-only",
    DAMAGED: "database damaged ({text}): stop the server and " + RESTORE_HINT,
    IO: "the disk holding the database failed a read or write ({text})",
}


class StorageFault(Exception):
    """A write the storage refused, by kind (FULL, READ_ONLY, DAMAGED, IO); picklable, so the ingest
    store process hands it back as it is."""

    def __init__(self, kind: str, text: str):
        super().__init__(kind, text)
        self.kind, self.text = kind, text

    @property
    def status(self) -> int:
        return 507 if self.kind == FULL else 503

    @property
    def reason(self) -> str:
        return WHY[self.kind].format(text=self.text)

    def __str__(self) -> str:
        return self.reason


def fault_of(e: BaseException) -> StorageFault | None:
    """The storage fault an error is, from SQLite's message or the OS's errno; None for any other error."""
    if isinstance(e, StorageFault):
        return e
    if isinstance(e, OSError):
        kind = {errno.ENOSPC: FULL, errno.EDQUOT: FULL, errno.EROFS: READ_ONLY}.get(e.errno or 0)
        return StorageFault(kind, e.strerror or str(e)) if kind else None
    text = str(getattr(e, "orig", None) or e)  # a SQLAlchemy error wraps the driver's
    low = text.lower()
    if "disk is full" in low:
        return StorageFault(FULL, text)
    if "readonly" in low or "read-only" in low:
        return StorageFault(READ_ONLY, text)
    if "malformed" in low or "not a database" in low:
        return StorageFault(DAMAGED, text)
    if "disk i/o error" in low:
        return StorageFault(IO, text)
    return None


class StorageHealth:
    """The newest storage fault the server met, for `/api/health` (any thread)."""

    def __init__(self, folder: Path, db_path: Path | None = None):
        self.folder = folder
        self.db_path = db_path  # damage met is left beside it (store.db.damage_marker): next start refuses
        self._lock = threading.Lock()
        self._fault: StorageFault | None = None

    def failed(self, fault: StorageFault) -> None:
        with self._lock:
            if self._fault is None or self._fault.kind != DAMAGED:  # damage outlives a full disk
                self._fault = fault
        if fault.kind == DAMAGED and self.db_path is not None:
            try:
                damage_marker(self.db_path).write_text(fault.text.splitlines()[0][:300] + "\n")
            except OSError as e:
                log.error("cannot leave the damage marker beside the database: %s", e)

    def worked(self) -> None:
        """A write went in: the disk has room and takes writes (damage stays until a restart)."""
        with self._lock:
            if self._fault is not None and self._fault.kind != DAMAGED:
                self._fault = None

    def state(self) -> tuple[str, str | None]:
        """("ok", None), or ("degraded", why) while a fault holds; a full disk or a read-only workspace
        is looked at again here (a probe file), so health says "ok" once space returns."""
        with self._lock:
            fault = self._fault
        if fault is not None and fault.kind != DAMAGED and self._probe():
            self.worked()
            fault = None
        return ("ok", None) if fault is None else ("degraded", fault.reason)

    def _probe(self) -> bool:
        probe = self.folder / ".storage-probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                whole = os.write(fd, b"\0" * PROBE_BYTES) == PROBE_BYTES  # a nearly full disk writes less
                os.fsync(fd)
            finally:
                os.close(fd)
            return whole
        except OSError:
            return False
        finally:
            try:
                probe.unlink()
            except OSError:
                pass


class IntegrityCheck(Worker):
    """The database's full check (SQLite's quick_check, every page read) beside the serving server,
    once shortly after the start and then daily: a start answers at once however long the history
    (settings.integrity_check). Damage found is a storage fault (`/api/health` degraded, why), is
    logged, and is left beside the file (StorageHealth.failed) so the next start refuses it."""

    name = "integrity-check"
    delay_s = 2.0  # the start's own work first
    background = True  # every page read: serving comes first (Worker.background)
    interval_s = 24 * 3600.0

    def __init__(self, db_path: Path, health: StorageHealth):
        super().__init__()
        self.db_path = db_path
        self.health = health
        self.state = "pending"  # pending, running, ok, damaged, or why it could not run
        self.checked_at: float | None = None
        self.took_s: float | None = None

    def run_once(self) -> None:
        self.state = "running"
        t0 = time.monotonic()
        try:
            found = quick_check(self.db_path)
        except OSError as e:
            self.state = f"not run: {e}"
            return
        self.checked_at, self.took_s = time.time(), time.monotonic() - t0
        if found is None:
            self.state = "ok"
            return
        self.state = "damaged"
        log.error("the database is damaged (%s): stop the server and %s", found, RESTORE_HINT)
        self.health.failed(StorageFault(DAMAGED, found))  # which leaves the marker

    def said(self) -> dict:
        """For `/api/health`: where the check stands, when it last ran and how long it took."""
        return {"state": self.state, "checked_at": self.checked_at, "took_s": self.took_s}
