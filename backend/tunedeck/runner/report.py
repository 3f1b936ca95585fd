"""Telemetry batches to the server: numbered, written to disk first, sent in order, retried.

The outbox file in the run folder is the write-ahead log: every batch is appended there before it
is sent, so a server that was away (or a runner that died) loses nothing: the server can replay the
file, and every item has a natural key (its line number), so a replayed batch is stored once.

With the files transport (runner_transport=files: compute nodes that cannot reach the server) the
outbox is the whole delivery: each batch is appended and synced to disk, and the server reads the
file from the shared run folder (services/ingest/outboxes.py); nothing is sent.

One request is in flight at a time, at most every MIN_GAP_S; batches that queued meanwhile go
together in the next one, so a trainer logging faster than the server answers (or a server that
was away) costs few requests, while a lone line still goes at once.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from pydantic import ValidationError

from tunedeck.contract import runfiles, wire
from tunedeck.contract.protocol import TelemetryBatch

MEMORY_REQUIRED = ("line", "t", "gpu", "used_bytes")
MIN_GAP_S = 0.05  # at most 20 requests a second from one runner
MERGE_BYTES = 1 << 20  # well under the server's body limit
LIST_MAX, STATES_MAX = 20000, 10  # the server's longest lists in one batch (models.TelemetryBatch)


def columns(rows: list[dict[str, Any]]) -> dict[str, list]:
    """Memory samples as one array per field (models.MemoryColumns): half the bytes of the row form,
    and the server validates and stores them without an object per sample. A field no sample has
    is left out."""
    keys = dict.fromkeys(k for r in rows for k in r)
    cols = {k: [r.get(k) for r in rows] for k in keys}
    return {k: v for k, v in cols.items() if k in MEMORY_REQUIRED or any(x is not None for x in v)}


def merge(batches: list[dict[str, Any]]) -> dict[str, Any]:
    """Consecutive batches as one, numbered as the last: every item keeps its line number, so the
    server stores the same rows either way."""
    if len(batches) == 1:
        return batches[0]
    out: dict[str, Any] = {"seq": batches[-1]["seq"], "metrics": [], "logs": [], "states": []}
    if batches[-1].get("node"):  # one runner's batches: one node
        out["node"] = batches[-1]["node"]
    for b in batches:
        for k in ("metrics", "logs", "states"):
            out[k] += b.get(k, [])
    parts = [b["memory"] for b in batches if b.get("memory")]
    if parts:
        keys = dict.fromkeys(k for p in parts for k in p)
        out["memory"] = {k: [x for p in parts for x in (p.get(k) or [None] * len(p["line"]))] for k in keys}
    return out


def body(batch: dict[str, Any], *, packed: bool = True) -> tuple[bytes, str]:
    """A request's body and its type: packed (tunedeck.contract.wire), or JSON for what does not pack."""
    if packed:
        try:
            return wire.encode(batch), wire.MEDIA_TYPE
        except wire.Unpackable:
            pass
    return json.dumps(batch).encode(), "application/json"


def unpacked(r: httpx.Response) -> bool:
    """Whether a refusal of a packed batch is the server not reading packed batches at all (one from
    before them: it wants a JSON object for the whole body), not a fault in the batch."""
    try:
        return r.status_code in (415, 422) and any(e.get("loc") == ["body"] for e in r.json()["detail"])
    except (ValueError, KeyError, TypeError, AttributeError):
        return False


def _say(text: str) -> None:
    print(f"[tunedeck runner] {text}", file=sys.stderr, flush=True)


def checked(batch: dict[str, Any], say: Callable[[str], None]) -> dict[str, Any] | None:
    """The batch as the server's model takes it: an item the model refuses is dropped here, where it
    was made (the server would refuse the whole batch for it), and said; None when nothing is left or
    the fault is not in one item."""
    try:
        TelemetryBatch.model_validate(batch)
        return batch
    except ValidationError as e:
        errors = e.errors()
    bad: dict[str, set[int]] = {}
    for err in errors:
        loc = err["loc"]
        if loc[0] in ("metrics", "logs", "states") and len(loc) > 1 and isinstance(loc[1], int):
            bad.setdefault(loc[0], set()).add(loc[1])
        elif loc[0] == "memory" and len(loc) > 2 and isinstance(loc[2], int):
            bad.setdefault("memory", set()).add(loc[2])
        else:
            bad = {}
            break
    why = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in errors[:5])
    if bad:
        out = {k: v for k, v in batch.items() if k != "memory"}
        for k in ("metrics", "logs", "states"):
            out[k] = [x for i, x in enumerate(batch[k]) if i not in bad.get(k, ())]
        if "memory" in batch:
            n = len(batch["memory"]["line"])
            keep = [i for i in range(n) if i not in bad.get("memory", ())]
            if keep:
                out["memory"] = {k: [col[i] for i in keep] for k, col in batch["memory"].items()}
        try:
            TelemetryBatch.model_validate(out)
        except ValidationError:
            pass
        else:
            say(f"dropped {sum(map(len, bad.values()))} telemetry item(s) the server would refuse: {why}")
            return out if _items(out) or out["states"] else None
    say(f"dropped a telemetry batch the server would refuse: {why}")
    return None


def _items(batch: dict[str, Any]) -> int:
    return len(batch["metrics"]) + len(batch["logs"]) + len(batch.get("memory", {}).get("line", ()))


class Reporter:
    def __init__(
        self,
        *,
        url: str,
        job_id: int,
        token: str,
        run_dir: Path,
        retry_max_s: float,
        merge_items: int = 2000,
        say: Callable[[str], None] = _say,
        node: str = "",
        outbox: str = runfiles.OUTBOX,
        send: bool = True,
    ):
        self.node = node  # named once per batch: the server keys this runner's samples by it
        self.say = say  # where a dropped item is told (the runner: a line in the job's log)
        self.endpoint = f"{url}/api/jobs/{job_id}/telemetry"
        self.headers = {"Authorization": f"Bearer {token}", "X-Tunedeck": "1"}
        self.outbox = run_dir / outbox
        self.retry_max_s = retry_max_s
        self.seq = 0
        self.merge_items = min(merge_items, LIST_MAX)
        self.packed = True  # until the server shows it reads JSON only
        self._pending: deque[tuple[dict[str, Any], int]] = deque()  # (batch, its size in bytes)
        self._cond = threading.Condition()
        self._stop = False
        self.delivered = 0
        self._unreachable_since: float | None = None  # the first of the newest attempts nobody answered
        # Told of each answer the server gave a batch (its requests ride on them: `stacks`).
        self.on_answer: Callable[[dict[str, Any]], None] | None = None
        self.send = send  # False: the files transport, the outbox file is the delivery
        if send:
            threading.Thread(target=self._send_loop, name="reporter", daemon=True).start()

    def add(self, *, metrics=(), logs=(), states=(), memory=()) -> None:
        if not (metrics or logs or states or memory):
            return
        made: dict[str, Any] = {
            "seq": self.seq,
            "metrics": list(metrics),
            "logs": list(logs),
            "states": list(states),
        }
        if self.node:
            made["node"] = self.node
        if memory:  # the sampler's VRAM / host-memory samples
            made["memory"] = columns(list(memory))
        batch = checked(made, self.say)
        if batch is None:
            return
        self.seq += 1
        line = json.dumps(batch) + "\n"
        with open(self.outbox, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            if not self.send:  # delivered once it is on disk: the server reads it there
                os.fsync(f.fileno())
        if not self.send:
            self.delivered += 1
            return
        with self._cond:
            self._pending.append((batch, len(line)))
            self._cond.notify()

    @property
    def pending(self) -> int:
        with self._cond:
            return len(self._pending)

    def unreachable_for(self) -> float | None:
        """Seconds since the attempts that got no answer at all (refused, timed out) began; None while
        the newest attempt was answered (any status: a server is there)."""
        since = self._unreachable_since
        return None if since is None else time.monotonic() - since

    def drain(self, timeout: float, leave: Callable[[], Any] | None = None) -> bool:
        """Wait until every batch is delivered (True), or the timeout passes or `leave()` is true
        (False; looked at every second at least)."""
        end = time.monotonic() + timeout
        with self._cond:
            while self._pending and time.monotonic() < end and not (leave is not None and leave()):
                self._cond.wait(timeout=min(1.0, max(0.0, end - time.monotonic())))
            return not self._pending

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()

    def post(self, path: str, body: dict[str, Any], timeout_s: float = 30.0) -> int | None:
        """One JSON request beside the batches (`path` under the job's telemetry route), with the
        runner's token: its status, or None when no server answered."""
        url = f"{self.endpoint}/{path}"
        try:
            r = httpx.post(url, json=body, headers=self.headers, timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return r.status_code

    def _group(self, most: int) -> list[dict[str, Any]]:
        """The oldest pending batches that fit in one request, `most` of them at most."""
        group: list[dict[str, Any]] = []
        size = items = states = 0
        for batch, n in self._pending:
            if group and (
                len(group) >= most
                or size + n > MERGE_BYTES
                or items + _items(batch) > self.merge_items
                or states + len(batch["states"]) > STATES_MAX
            ):
                break
            group.append(batch)
            size, items, states = size + n, items + _items(batch), states + len(batch["states"])
        return group

    def _send_loop(self) -> None:
        backoff, last = 0.2, 0.0
        most = LIST_MAX  # halved while a request of several is refused, until the refused batch is found
        with httpx.Client(timeout=30) as client:
            while True:
                with self._cond:
                    while not self._pending and not self._stop:
                        self._cond.wait()
                    if self._stop and not self._pending:
                        return
                time.sleep(max(0.0, last + MIN_GAP_S - time.monotonic()))  # what comes meanwhile joins in
                with self._cond:
                    group = self._group(most)
                last = time.monotonic()
                content, kind = body(merge(group), packed=self.packed)
                try:
                    r = client.post(
                        self.endpoint, content=content, headers={**self.headers, "Content-Type": kind}
                    )
                    ok, permanent = r.status_code < 300, r.status_code in (400, 401, 403, 404, 413, 422)
                    self._unreachable_since = None
                except httpx.HTTPError:
                    ok, permanent, r = False, False, None
                    if self._unreachable_since is None:
                        self._unreachable_since = last
                if r is not None and kind == wire.MEDIA_TYPE and unpacked(r):
                    _say("the server does not read packed batches: sending JSON")
                    self.packed = False
                    continue
                if permanent and len(group) > 1:  # one of them is refused: find it by halving
                    most = len(group) // 2
                    continue
                if ok and self.on_answer is not None and r is not None:
                    try:
                        answer = r.json()
                    except ValueError:
                        answer = None
                    if isinstance(answer, dict):
                        self.on_answer(answer)
                if ok or permanent:
                    if permanent:  # the server will never take it; it stays in the outbox file
                        assert r is not None  # only an answer is permanent
                        most = LIST_MAX
                        _say(f"batch {group[0]['seq']} refused: {r.status_code} {r.text[:300]}")
                    with self._cond:
                        for _ in group:
                            self._pending.popleft()
                        self.delivered += len(group)
                        self._cond.notify_all()
                    backoff = 0.2
                else:
                    time.sleep(backoff)
                    backoff = min(backoff * 2, self.retry_max_s)
