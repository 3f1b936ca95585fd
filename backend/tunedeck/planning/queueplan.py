"""Who starts next, on which devices, and why the others wait: one pass over the queue.

The scheduler launches what `plan` says starts; the API shows the same plan's place and reason for
every queued job, so what a page says is what the scheduler does. The rules are in scheduler.py.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone

from sqlmodel import Session, select

from tunedeck.store.tables import Job, JobStatus, utcnow


@dataclass(frozen=True)
class Asked:
    """What a job's spec asks of the scheduler and the launch, beyond its GPU count."""

    priority: int = 0
    devices: tuple[int, ...] | None = None
    env: dict[str, str] = field(default_factory=dict)


def asked(job: Job) -> Asked:
    """Read from the stored spec; a spec from before these keys existed asks for nothing."""
    try:
        spec = json.loads(job.spec or "{}")
    except ValueError:
        return Asked()
    if not isinstance(spec, dict):
        return Asked()
    devices = spec.get("devices")
    return Asked(
        priority=int(spec.get("priority") or 0),
        devices=tuple(int(d) for d in devices) if devices else None,
        env={str(k): str(v) for k, v in (spec.get("env") or {}).items()},
    )


@dataclass(frozen=True)
class Capacity:
    gpus: int
    cpu_slots: int
    paused: bool = False
    backfill_max_wait_s: float = 1800.0


@dataclass(frozen=True)
class Spot:
    position: int  # 1 = first in line
    waiting_for: str  # in words; "nothing: starting now" for a job this pass starts


@dataclass
class Plan:
    starts: list[tuple[Job, list[int]]]
    spots: dict[int, Spot]


STARTING = "nothing: starting now"


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)  # SQLite returns naive datetimes


def _ids(ids: list[int]) -> str:
    return ("job " if len(ids) == 1 else "jobs ") + ", ".join(map(str, ids))


def _gpus(devices: list[int]) -> str:
    return ("GPU " if len(devices) == 1 else "GPUs ") + ", ".join(map(str, devices))


class _Pass:
    def __init__(self, running: list[Job], cap: Capacity):
        self.cap = cap
        self.holder = {int(d): j.id for j in running if j.devices for d in j.devices.split(",")}
        self.cpu_holders = [j.id for j in running if j.gpus == 0]
        self.kept: dict[int, Job] = {}  # free or held device → the job ahead it is kept for

    def free(self) -> list[int]:
        return [d for d in range(self.cap.gpus) if d not in self.holder]

    def usable(self) -> list[int]:
        return [d for d in self.free() if d not in self.kept]

    def take(self, job: Job, devices: list[int]) -> None:
        for d in devices:
            self.holder[d] = job.id
        if not devices:
            self.cpu_holders.append(job.id)

    def why(self, devices: list[int]) -> str:
        """Why each of these devices cannot be had: '; '-joined, grouped by holder."""
        groups: dict[str, list[int]] = {}
        for d in devices:
            if d >= self.cap.gpus:
                groups.setdefault(f"not on this node (it has {self.cap.gpus})", []).append(d)
            elif d in self.holder:
                groups.setdefault(f"held by job {self.holder[d]}", []).append(d)
            elif d in self.kept:
                groups.setdefault(f"kept for job {self.kept[d].id}", []).append(d)
        return "; ".join(f"{_gpus(ds)} {what}" for what, ds in groups.items())


def _behind(job: Job, ahead: Job) -> str:
    higher = asked(ahead).priority > asked(job).priority
    return f"behind job {ahead.id} ({'higher priority' if higher else 'queued earlier'})"


def plan(running: list[Job], queued: list[Job], cap: Capacity, now: datetime | None = None) -> Plan:
    """One pass: jobs in order of priority, then age; each starts when what it asks for is free and
    not kept for a job ahead of it."""
    now = now or utcnow()
    order = sorted(queued, key=lambda j: (-asked(j).priority, j.id))
    p = _Pass(running, cap)
    pinned = Counter(d for j in order for d in (asked(j).devices or ()))
    starts: list[tuple[Job, list[int]]] = []
    spots: dict[int, Spot] = {}
    cpu_waiting: Job | None = None  # CPU slots are alike: behind a waiting CPU job, every CPU job waits
    for position, job in enumerate(order, start=1):
        want = asked(job).devices
        if cap.paused:
            spots[job.id] = Spot(position, "launches paused")
            continue
        if job.gpus == 0 and not want:
            if cpu_waiting is None and cap.cpu_slots - len(p.cpu_holders) > 0:
                starts.append((job, []))
                p.take(job, [])
                spots[job.id] = Spot(position, STARTING)
            else:
                reason = (
                    _behind(job, cpu_waiting)
                    if cpu_waiting is not None
                    else f"a CPU slot (held by {_ids(p.cpu_holders)})"
                )
                spots[job.id] = Spot(position, reason)
                cpu_waiting = cpu_waiting or job
            continue
        if want:
            chosen = list(want) if all(d in p.usable() for d in want) else None
        else:
            # Devices a later job is pinned to are given last, so that job is not blocked for nothing.
            usable = sorted(p.usable(), key=lambda d: (pinned[d] > 0, d))
            chosen = usable[: job.gpus] if len(usable) >= job.gpus else None
        if chosen is not None:
            starts.append((job, chosen))
            p.take(job, chosen)
            spots[job.id] = Spot(position, STARTING)
            if want:
                pinned.subtract(want)
            continue
        spots[job.id] = Spot(position, _waiting(p, job, want))
        # Keep devices for this job: its own GPUs always (nobody else can use them for it), and, once
        # it has waited its turn out, every free one, so that later jobs no longer overtake it.
        if want:
            for d in want:
                p.kept.setdefault(d, job)
        elif (now - _aware(job.created_at)).total_seconds() >= cap.backfill_max_wait_s:
            for d in p.free():
                p.kept.setdefault(d, job)
    return Plan(starts, spots)


def _waiting(p: _Pass, job: Job, want: tuple[int, ...] | None) -> str:
    if want:
        blocked = [d for d in want if d not in p.usable()]
        if all(d in p.kept and d not in p.holder and d < p.cap.gpus for d in blocked):
            return _behind(job, p.kept[blocked[0]])
        return f"{_gpus(list(want))} ({p.why(blocked)})"
    if job.gpus > p.cap.gpus:
        return f"{job.gpus} GPUs; this node has {p.cap.gpus}"
    if len(p.free()) >= job.gpus:  # free enough, but kept for a job ahead
        return _behind(job, p.kept[next(d for d in p.free() if d in p.kept)])
    usable = p.usable()
    others = [d for d in range(p.cap.gpus) if d not in usable]
    need = f"{job.gpus} GPU" + ("s" if job.gpus != 1 else "")
    return f"{need}; {len(usable)} free ({p.why(others)})"


def read(session: Session, cap: Capacity, now: datetime | None = None) -> Plan:
    """The plan for the queue as the database holds it now."""
    running = list(session.exec(select(Job).where(Job.status == JobStatus.running)))
    queued = list(session.exec(select(Job).where(Job.status == JobStatus.queued)))
    return plan(running, queued, cap, now)
