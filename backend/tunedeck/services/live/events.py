"""Wake-ups for live streams: who should look at the database again, and when.

Nothing here holds data. Streams replay from SQLite after their cursor (services/live/feed.py), so a
reconnecting browser gets exactly what it missed and a slow one never makes the server buffer.
This module only tells waiting streams that something may have changed:
- the ingest writer calls `notify(job_ids)` from its thread after each commit (metrics, logs,
  memory samples, progress, exit states: instant);
- a light watcher task reads `job_changes` (kept by triggers) and new alert ids every
  `stream_poll_s` and wakes the streams of jobs changed elsewhere (scheduler start, cancel, runner
  lost, the alert engine's thread) without hooks in those modules.

The team streams wake at most once every `team_every_s`: on a cluster every batch of every job
changes its row, and a wake-up per batch would send as many events. A change inside the interval
wakes them at its end, and their read then sends every row changed meanwhile, each as it is now.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import AsyncIterator, Sequence
from typing import Any

from sqlalchemy import Engine, text

log = logging.getLogger("tunedeck.events")
TEAM = 0  # key of the wake-up shared by team streams (job ids start at 1)


class Broadcaster:
    def __init__(self, engine: Engine, *, poll_s: float = 0.5, team_every_s: float = 0.0):
        self.engine = engine
        self.poll_s = poll_s
        self.team_every_s = team_every_s
        self._team_at = -math.inf  # loop time of the team streams' last wake-up
        self._team_held: asyncio.TimerHandle | None = None  # their next one, when a change came too soon
        self.loop: asyncio.AbstractEventLoop | None = None
        self._events: dict[int, asyncio.Event] = {}
        self._task: asyncio.Task | None = None
        self._seen_seq: int | None = None
        self._seen_alert: int | None = None
        self.generation = 0  # counts wake-ups; a read started at generation g has seen every change before g
        # Wake-ups of each ticket's key: a stream joins a read started at its key's generation or later
        # (`shared`). Counted per key: a job's batch bumps the overall count, and team streams resuming
        # from one wake-up while batches were stored read again and again instead of once.
        self._woken: dict[int, int] = {}
        self._reads: dict[tuple, tuple[int, asyncio.Future]] = {}
        self.clients = 0  # open streams, for /metrics

    # ---------------------------------------------------------------- lifecycle (event loop)
    def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self._task = self.loop.create_task(self._watch(), name="stream-watcher")

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._team_held is not None:
            self._team_held.cancel()
        self._fire({TEAM, *self._events}, held=False)  # let open streams notice the shutdown

    # ---------------------------------------------------------------- any thread
    def notify(self, job_ids: set[int] | None = None) -> None:
        """Wake the streams of these jobs and the team streams; safe from any thread."""
        if self.loop is None or self.loop.is_closed():
            return
        keys = {TEAM, *(job_ids or ())}
        with contextlib.suppress(RuntimeError):  # the loop closed under us at shutdown
            self.loop.call_soon_threadsafe(self._fire, keys)

    # ---------------------------------------------------------------- event loop only
    def ticket(self, key: int) -> asyncio.Event:
        """Take before reading the database: a change after this point sets the returned event."""
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = asyncio.Event()
        return ev

    def woken(self, key: int) -> int:
        """How many times the tickets of `key` were set: taken with a ticket, the `since` of a read
        that the ticket's holder shares (a read started at that count or later has seen every change
        the ticket would not wake it for)."""
        return self._woken.get(key, 0)

    async def wait(self, ticket: asyncio.Event, timeout: float) -> bool:
        try:
            await asyncio.wait_for(ticket.wait(), timeout)
            return True
        except asyncio.TimeoutError:
            return False

    async def shared(self, key: tuple, since: int, read, *, ticket: int | None = None):
        """Run `read` in a thread, or join an identical read that started at generation >= `since`
        (with `ticket`: at that key's count of wake-ups >= `since`, `woken`).

        Streams at the same cursor ask the same question after each wake-up; one answer serves
        them all, so a hundred open pages of a job cost one database read per change. A change made
        after a read started and before a stream took its ticket either set that key's tickets since
        (the stream's `since` is then past the read's) or will set its ticket: the stream reads again."""
        key = (ticket, *key)  # (counts of different keys are not compared)
        hit = self._reads.get(key)
        if hit is not None and hit[0] >= since:
            return await asyncio.shield(hit[1])
        fut = asyncio.get_running_loop().create_future()
        self._reads[key] = (self.generation if ticket is None else self.woken(ticket), fut)
        try:
            result = await asyncio.to_thread(read)
        except BaseException as e:
            fut.set_exception(e)
            fut.exception()  # retrieved: no "never retrieved" warning when nobody joined
            raise
        finally:
            if self._reads.get(key, (None, None))[1] is fut:
                del self._reads[key]
        fut.set_result(result)
        return result

    async def counted(self, events: AsyncIterator):
        """A stream's events, passed through; the stream counts as a client until it ends or drops."""
        self.clients += 1
        try:
            async for ev in events:
                yield ev
        finally:
            self.clients -= 1

    def _fire(self, keys: set[int], *, held: bool = True) -> None:
        if TEAM in keys and held and self.loop is not None:
            now = self.loop.time()
            due = self._team_at + self.team_every_s - now
            if due > 0:  # too soon after the last: at the interval's end, for every change until then
                keys = keys - {TEAM}
                if self._team_held is None:
                    self._team_held = self.loop.call_later(due, self._team_due)
            else:
                self._team_at = now
        self.generation += 1
        for key in keys:
            self._woken[key] = self._woken.get(key, 0) + 1
            ev = self._events.pop(key, None)
            if ev is not None:
                ev.set()

    def _team_due(self) -> None:
        self._team_held = None
        self._fire({TEAM})

    async def _watch(self) -> None:
        while True:
            try:
                changed = await asyncio.to_thread(self._changed_jobs)
                if changed:
                    self._fire({TEAM, *changed})
            except Exception:
                log.debug("stream watcher pass failed", exc_info=True)
            await asyncio.sleep(self.poll_s)

    def _changed_jobs(self) -> set[int]:
        """Jobs changed since the last pass: job rows (triggers) and new alerts (the alert engine
        writes them from its own thread, after the ingest commit that woke the streams)."""
        with self.engine.connect() as conn:
            first = self._seen_seq is None
            if first:
                self._seen_seq = conn.execute(
                    text("SELECT coalesce(max(seq), 0) FROM job_changes")
                ).scalar_one()
            rows = conn.execute(
                text("SELECT seq, job_id FROM job_changes WHERE seq > :s"), {"s": self._seen_seq}
            ).all()
            alerts: Sequence[Any] = []
            try:
                if self._seen_alert is None:
                    self._seen_alert = conn.execute(
                        text("SELECT coalesce(max(id), 0) FROM alerts")
                    ).scalar_one()
                alerts = conn.execute(
                    text("SELECT id, job_id FROM alerts WHERE id > :a"), {"a": self._seen_alert}
                ).all()
            except Exception:
                conn.rollback()
        if rows:
            self._seen_seq = max(r[0] for r in rows)
        if alerts:
            self._seen_alert = max(r[0] for r in alerts)
        return set() if first else {r[1] for r in rows} | {r[1] for r in alerts}
