"""Telemetry batches to the server: numbered, written to disk first, sent in order, retried.

The outbox file in the run folder is the write-ahead log: every batch is appended there before it
is sent, so a server that was away (or a runner that died) loses nothing: the server can replay the
file, and every item has a natural key (its line number), so a replayed batch is stored once.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx

OUTBOX = "outbox.jsonl"
MEMORY_REQUIRED = ("line", "t", "gpu", "used_bytes")


def columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Memory samples as one array per field (models.MemoryColumns): half the bytes of the row form,
    and the server validates and stores them without an object per sample. A field no sample has
    is left out."""
    keys = dict.fromkeys(k for r in rows for k in r)
    cols = {k: [r.get(k) for r in rows] for k in keys}
    return {k: v for k, v in cols.items() if k in MEMORY_REQUIRED or any(x is not None for x in v)}


class Reporter:
    def __init__(self, *, url: str, job_id: int, token: str, run_dir: Path, retry_max_s: float):
        self.endpoint = f"{url}/api/jobs/{job_id}/telemetry"
        self.headers = {"Authorization": f"Bearer {token}", "X-Tunedeck": "1"}
        self.outbox = run_dir / OUTBOX
        self.retry_max_s = retry_max_s
        self.seq = 0
        self._pending: deque[dict[str, Any]] = deque()
        self._cond = threading.Condition()
        self._stop = False
        self.delivered = 0
        self._thread = threading.Thread(target=self._send_loop, name="reporter", daemon=True)
        self._thread.start()

    def add(self, *, metrics=(), logs=(), states=(), memory=()) -> None:
        if not (metrics or logs or states or memory):
            return
        batch = {"seq": self.seq, "metrics": list(metrics), "logs": list(logs), "states": list(states)}
        if memory:  # issue 3: the sampler's VRAM / host-memory samples
            batch["memory"] = columns(list(memory))
        self.seq += 1
        with open(self.outbox, "a", encoding="utf-8") as f:
            f.write(json.dumps(batch) + "\n")
            f.flush()
        with self._cond:
            self._pending.append(batch)
            self._cond.notify()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def drain(self, timeout: float) -> bool:
        """Wait until every batch is delivered (True) or the timeout passes (False)."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._pending and time.monotonic() < end:
                self._cond.wait(timeout=min(1.0, max(0.0, end - time.monotonic())))
            return not self._pending

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def _send_loop(self) -> None:
        backoff = 0.2
        with httpx.Client(timeout=30) as client:
            while True:
                with self._cond:
                    while not self._pending and not self._stop:
                        self._cond.wait()
                    if self._stop and not self._pending:
                        return
                    batch = self._pending[0]
                try:
                    r = client.post(self.endpoint, json=batch, headers=self.headers)
                    ok, permanent = r.status_code < 300, r.status_code in (400, 401, 403, 404, 413, 422)
                except httpx.HTTPError:
                    ok, permanent, r = False, False, None
                if ok or permanent:
                    if permanent:  # the server will never take it; it stays in the outbox file
                        print(f"[tunedeck runner] batch {batch['seq']} refused: {r.status_code} {r.text[:300]}",
                              file=sys.stderr, flush=True)
                    with self._cond:
                        self._pending.popleft()
                        self.delivered += 1
                        self._cond.notify_all()
                    backoff = 0.2
                else:
                    time.sleep(backoff)
                    backoff = min(backoff * 2, self.retry_max_s)
