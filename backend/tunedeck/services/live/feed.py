"""What a live stream sends: rows after a composite cursor, read back from SQLite.

The cursor names the last row of every kind a client holds: `m<metric id>-l<log id>-s<memory
sample id>-a<alert id>-j<job change seq>`. Each event carries the whole cursor as its SSE id, so
a browser reconnecting with Last-Event-ID resumes exactly after what it received: row ids only
grow (one SQLite writer at a time), hence no gaps and no duplicates, and no buffer in memory.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from sqlalchemy import Engine, text
from sqlmodel import Session, col, select
from sse_starlette.event import ServerSentEvent

from tunedeck.contract import strictjson
from tunedeck.contract.lflog import METRICS
from tunedeck.planning.queueplan import Spot
from tunedeck.schemas import AlertOut
from tunedeck.services.alerting.summary import job_outs
from tunedeck.store import bulk
from tunedeck.store.tables import Job, JobStatus

ROW_TTL_S = 1.0
_ROWS: dict[tuple, tuple[float, dict]] = {}
CURSOR = re.compile(r"^m(\d{1,20})-l(\d{1,20})-s(\d{1,20})-a(\d{1,20})-j(\d{1,20})$")
ID_MAX = 2**63 - 1  # SQLite's largest rowid


class BadCursor(ValueError):
    pass


@dataclass
class Cursor:
    m: int = 0
    l: int = 0
    s: int = 0
    a: int = 0
    j: int = 0

    def __str__(self) -> str:
        return "-".join(f"{f.name}{getattr(self, f.name)}" for f in fields(self))

    @classmethod
    def parse(cls, value: str | None) -> Cursor:
        if not value:
            return cls()
        m = CURSOR.match(value.strip())
        if not m:
            raise BadCursor(f"bad stream cursor {value[:100]!r}; expected m<n>-l<n>-s<n>-a<n>-j<n>")
        ids = [int(g) for g in m.groups()]
        if max(ids) > ID_MAX:  # SQLite cannot even compare with it: the stream would die at its first read
            raise BadCursor(f"stream cursor {value[:100]!r} holds an id beyond {ID_MAX}")
        return cls(*ids)


@dataclass
class Event:
    event: str
    data: Any
    id: str
    _wire: bytes | None = field(default=None, init=False, repr=False, compare=False)

    def sse(self) -> bytes:
        """The event as a stream sends it, encoded once: streams at one cursor share a read's events
        (Broadcaster.shared), so two hundred open pages cost one JSON encoding, not two hundred.
        JSON as json.dumps writes it holds no line break (those in strings are escaped), nor do a
        cursor or an event's name: the frame is written at once, the bytes sse_starlette's
        ServerSentEvent gives, without its regular-expression pass over the data (a team event of
        fifty rows is ~50 kB, and that pass cost several times the JSON encoding)."""
        if self._wire is None:
            data = strictjson.dumps(self.data, default=str)
            if any("\r" in x or "\n" in x for x in (data, self.event, self.id)):  # (never, as said)
                self._wire = ServerSentEvent(data=data, event=self.event, id=self.id).encode()
            else:
                self._wire = f"id: {self.id}\r\nevent: {self.event}\r\ndata: {data}\r\n\r\n".encode()
        return self._wire


def job_extras(job: Job) -> dict:
    """The jobs page's columns beyond JobOut (whose `alerts` the badge reads): last loss, peak VRAM.
    Ingest keeps them on the job as it stores each batch (writer.summarise): a row read here costs
    the same however long the run (a max() over the samples read them all, every batch). An inf or
    NaN loss is the newest loss too: the row says so (strictjson's `nonfinite`)."""
    bad = job.last_loss_nonfinite
    return {
        "last_loss": job.last_loss,
        "peak_vram_bytes": job.peak_vram_bytes,
        "total_vram_bytes": job.total_vram_bytes,
        "nonfinite": {"last_loss": bad} if bad else None,
    }


Queue = Callable[[Session], Mapping[int, Spot]]  # queued jobs' places (the scheduler's `queue`)


def job_rows(
    engine: Engine, job_ids: list[int], *, seq: int | None = None, queue: Queue | None = None
) -> list[dict]:
    """Jobs as the pages show them: JobOut plus the extras, and a queued job's place from `queue`.

    With `seq` (one job at that change), the row is shared for a second by every stream that asks:
    a hundred open pages of one job then cost one read per change, not a hundred."""
    key = (id(engine), job_ids[0], seq) if seq is not None and len(job_ids) == 1 else None
    if key is not None and (hit := _ROWS.get(key)) and time.monotonic() - hit[0] < ROW_TTL_S:
        return [hit[1]]
    with Session(engine) as session:
        jobs = list(session.exec(select(Job).where(col(Job.id).in_(job_ids))))
        spots = (
            queue(session) if queue is not None and any(j.status == JobStatus.queued for j in jobs) else {}
        )
        by_id = {
            j.id: {**out.placed(spots).model_dump(mode="json"), **job_extras(j)}
            for j, out in zip(jobs, job_outs(session, jobs))
        }
    rows = [by_id[i] for i in job_ids if i in by_id]
    if key is not None and rows:
        _ROWS[key] = (time.monotonic(), rows[0])
        for k in [k for k, (t, _) in list(_ROWS.items()) if time.monotonic() - t > ROW_TTL_S]:
            _ROWS.pop(k, None)
    return rows


def team_events(
    engine: Engine, cur: Cursor, *, limit: int, queue: Queue | None = None
) -> tuple[list[Event], Cursor]:
    """Jobs changed after the cursor, or with alerts newer than it: one `jobs` event, current rows.
    Any job's change may move every queued job's place or reason: those rows come along."""
    cur = replace(cur)  # results are shared between streams: never touch the caller's cursor
    with engine.connect() as conn:
        changes = conn.execute(
            text("SELECT seq, job_id FROM job_changes WHERE seq > :s ORDER BY seq LIMIT :n"),
            {"s": cur.j, "n": limit},
        ).all()
        # A new alert changes a row's badge without touching the job itself.
        alerts = conn.execute(
            text("SELECT id, job_id FROM alerts WHERE id > :a ORDER BY id LIMIT :n"), {"a": cur.a, "n": limit}
        ).all()
        waiting = (
            conn.execute(
                text("SELECT id FROM jobs WHERE status = 'queued' ORDER BY id LIMIT :n"), {"n": limit}
            ).all()
            if changes
            else []
        )
    if not changes and not alerts:
        return [], cur
    if changes:
        cur.j = changes[-1][0]
    if alerts:
        cur.a = alerts[-1][0]
    ids = list(dict.fromkeys([c[1] for c in changes] + [a[1] for a in alerts] + [w[0] for w in waiting]))
    rows = job_rows(engine, ids, queue=queue)
    return [Event("jobs", rows, str(cur))], cur


KINDS: list[tuple[str, str, str]] = [  # a job stream's kinds: event name, cursor letter, rows
    ("metrics", "m", f"SELECT id, step, t, {', '.join(METRICS)}, nonfinite FROM metric_points"),
    ("logs", "l", "SELECT id, t, stream, text FROM log_lines"),
    ("memory", "s", "SELECT * FROM memory_samples"),
    ("alerts", "a", "SELECT * FROM alerts"),
]


def _one(db: sqlite3.Cursor, sql: str, **params: Any) -> Any:
    row = db.execute(sql, params).fetchone()
    return row[0] if row is not None else None


def job_events(
    engine: Engine, job_id: int, cur: Cursor, *, limit: int, queue: Queue | None = None
) -> tuple[list[Event], Cursor, bool]:
    """One job's new rows after the cursor; `more` when a kind hit the limit and another read is due.
    A queued job's row is sent again on any job's change: its place and reason follow the others."""
    cur = replace(cur)  # results are shared between streams: never touch the caller's cursor
    events: list[Event] = []
    more = False
    with engine.connect() as conn:
        # The driver's own cursor: a job page reads after every batch of its job, and SQLAlchemy's
        # statement and result handling cost several times the reads themselves.
        db = bulk.driver_cursor(conn)
        try:
            # The job row first, so a page sees `running` before that run's first points.
            seq = _one(db, "SELECT seq FROM job_changes WHERE job_id=:j AND seq > :s", j=job_id, s=cur.j)
            if _one(db, "SELECT status FROM jobs WHERE id=:j", j=job_id) == "queued":
                # Seqs only grow: the newest of all is past this job's own, and its next change is past that.
                seq = _one(db, "SELECT max(seq) FROM job_changes WHERE seq > :s", s=cur.j)
            batches = []
            for name, letter, sql in KINDS:
                after = getattr(cur, letter)
                # Caught up (after > 0): walk the rowid from the cursor, a few rows. From the start: the
                # job_id index. (`+job_id` keeps SQLite off that index, which would sort the whole job.)
                job_col = "+job_id" if after else "job_id"
                db.execute(
                    f"{sql} WHERE id > :after AND {job_col} = :j ORDER BY id LIMIT :n",
                    {"after": after, "j": job_id, "n": limit},
                )
                names = [d[0] for d in db.description]
                rows = [dict(zip(names, r)) for r in db.fetchall()]
                if (
                    name == "alerts"
                ):  # as GET /api/jobs/{id}/alerts gives them: `change` an object, `open` a bool
                    rows = [AlertOut.model_validate(r).model_dump(mode="json") for r in rows]
                for r in rows:
                    r.pop("job_id", None)
                    if r.get("nonfinite"):  # stored as JSON text: sent as the object it is
                        r["nonfinite"] = json.loads(r["nonfinite"])
                more = more or len(rows) == limit
                batches.append((name, letter, rows))
        finally:
            db.close()
    if seq is not None:
        cur.j = seq
        for row in job_rows(engine, [job_id], seq=seq, queue=queue):  # none if the job was just deleted
            events.append(Event("job", row, str(cur)))
    for name, letter, rows in batches:
        if rows:
            setattr(cur, letter, rows[-1]["id"])
            events.append(Event(name, rows, str(cur)))
    return events, cur, more


def current_cursor(engine: Engine) -> Cursor:
    """The newest row of every kind: a client that loaded history up to now streams from here."""
    with engine.connect() as conn:

        def top(sql: str) -> int:
            return int(conn.execute(text(sql)).scalar() or 0)

        return Cursor(
            m=top("SELECT max(id) FROM metric_points"),
            l=top("SELECT max(id) FROM log_lines"),
            s=top("SELECT max(id) FROM memory_samples"),
            a=top("SELECT max(id) FROM alerts"),
            j=0,  # job rows are state: a fresh client always wants the current one
        )
