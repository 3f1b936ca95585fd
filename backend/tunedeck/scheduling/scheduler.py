"""Queue and device allocation, and the watch over running jobs.

Order: higher `priority` first, then the order submitted. Detected GPUs are slots; a CPU-only job
takes one of `cpu_slots`. A job starts when what it asks for is free: `gpus` devices (the lowest
free ones, those a later job is pinned to last) or exactly its `devices`.

Backfill without run-time estimates: a job that cannot start does not hold up the jobs behind it
while they fit on devices it cannot use now; only what it is sure to need is kept for it.
- A job pinned to `devices` keeps those devices: as each frees, nobody behind it takes it.
- A job asking for a GPU count keeps nothing during its first `backfill_max_wait_s` in the queue:
  smaller jobs behind it may start on idle GPUs (and may delay it, since how long they run is not
  known). After that wait it keeps every GPU that is free or frees, so no job behind it starts on
  a GPU any more: it starts as soon as the jobs already running leave it enough. A big job is thus
  never starved by a stream of small ones; at worst it waits out the window plus the runs it let in.
- CPU slots are all alike: CPU jobs start in order, and never wait for GPU jobs (nor these for them).
Priority is absolute: a job waits while a job of higher priority that is ahead of it cannot start
and keeps what it needs.

An executor that places jobs itself (Ray: `plans_devices` False) gets the same order and rules on
its cluster (placement.order): the queue stays here, in SQLite, and a job starts only once all of
its placement is reserved.
"""

from __future__ import annotations

import json
import logging
import secrets
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from tunedeck.config import Settings
from tunedeck.contract import runfiles
from tunedeck.planning import placement, queueplan
from tunedeck.services.ingest.devices import Devices
from tunedeck.services.ingest.replay import admitted
from tunedeck.services.ingest.writer import OUTSIDE_STOP, RESUME_PENDING, TIME_LIMIT, IngestWriter
from tunedeck.services.jobs.jobstate import JobState, explain, move
from tunedeck.store.hashes import token_hash
from tunedeck.store.tables import Job, JobStatus, core, utcnow
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.scheduling.scheduler")
EXPLAIN_S = 180.0  # how long after a stop from outside tunedeck its executor is asked why


class Scheduler(Worker):
    name = "scheduler"

    def __init__(
        self,
        *,
        settings: Settings,
        engine: Engine,
        executor,
        writer: IngestWriter,
        state: JobState,
        node_gpus: int,
        devices: Devices | None = None,
    ):
        super().__init__()
        self.devices = devices  # what a replayed outbox may name, as the telemetry route holds it
        self.settings = settings
        self.engine = engine
        self.executor = executor
        self.writer = writer
        self.state = state
        self.node_gpus = node_gpus
        self.interval_s = settings.scheduler_interval_s
        self.capacity = queueplan.Capacity(
            gpus=node_gpus,
            cpu_slots=settings.cpu_slots,
            paused=settings.launch_paused,
            backfill_max_wait_s=settings.backfill_max_wait_s,
        )
        self._spots: dict[int, queueplan.Spot] = {}  # the last pass's, when the executor places

    def run_once(self) -> None:
        self.tick()

    # ------------------------------------------------------------------ the server starts and stops
    def start(self) -> None:
        """The server is back: runners whose trainer ends deliver to it again (runfiles.SERVER_STOPPED)."""
        for run_dir in self._running_dirs():
            try:
                (run_dir / runfiles.SERVER_STOPPED).unlink(missing_ok=True)
            except OSError:  # an unwritable run folder: its runner sees the server answer all the same
                pass
        super().start()

    def stop(self) -> None:
        """Tell the running jobs' runners, through their run folders (any executor's, any node's):
        one whose trainer has ended and that finds no server leaves its outbox to the next start (the
        first pass replays it) instead of retrying for `runner_give_up_s`."""
        super().stop()
        for run_dir in self._running_dirs():
            try:
                (run_dir / runfiles.SERVER_STOPPED).write_text(f"{utcnow().isoformat()}\n")
            except OSError as e:  # a run folder gone or unwritable: that runner waits as before
                log.warning("cannot tell the runner in %s that the server stops: %s", run_dir, e)

    def _running_dirs(self) -> list[Path]:
        try:
            with Session(self.engine) as session:
                return [
                    Path(d)
                    for d in session.exec(select(Job.run_dir).where(Job.status == JobStatus.running))
                    if d
                ]
        except Exception:  # (a database that cannot be read: nothing to tell)
            log.exception("scheduler: the running jobs' run folders could not be read")
            return []

    # ------------------------------------------------------------------ one pass
    def tick(self) -> None:
        with Session(self.engine) as session:
            running = list(session.exec(select(Job).where(Job.status == JobStatus.running)))
            if running:  # (after a restart: their runners post on; the first batch is not held by a start)
                self.writer.warm()
            for job in running:
                self._watch(session, job)
            self._explain_stops(session)
            if not self.settings.launch_paused:
                self._start_queued(session)
            if not self.executor.plans_devices:  # placements and actors of jobs that ended
                active = select(Job.id).where(col(Job.status).in_([JobStatus.running, JobStatus.queued]))
                self.executor.sweep(set(session.exec(active)))

    def _watch(self, session: Session, job: Job) -> None:
        if self.executor.alive(job):
            grace = self.settings.cancel_abort_grace_s + self.settings.cancel_term_grace_s + 30
            if job.cancel_requested_at and utcnow() - _aware(job.cancel_requested_at) > timedelta(
                seconds=grace
            ):
                log.warning("job %s: runner ignored cancel for %ss; killing", job.id, grace)
                self.executor.kill(job)
            return
        session.refresh(job)  # a runner exits only after its last batch is stored, or gives up
        if job.status != JobStatus.running:
            return
        self._recover(session, job)

    def _explain_stops(self, session: Session) -> None:
        """A runner stopped by a signal no cancel sent fails its job saying only that (writer.OUTSIDE_STOP);
        its cluster may know why. Slurm ends a job whose node failed by signalling the runners on the
        nodes left, and rank 0's reports before squeue reads NODE_FAIL: for EXPLAIN_S after such an end
        the executor is asked, and its answer becomes the error (the one the watch gives when it sees
        the node failure first). A preemption is the cluster's, not the job's: whether its runners were
        warned (they stopped with a checkpoint, as at a time limit) or only signalled, the error says
        so and the next attempt continues from the newest checkpoint (auto_resume)."""
        since = utcnow() - timedelta(seconds=EXPLAIN_S)
        stopped = session.exec(
            select(Job).where(
                Job.status == JobStatus.failed,
                col(Job.finished_at) >= since,
                col(Job.error).startswith(OUTSIDE_STOP, autoescape=True)
                | col(Job.error).startswith(TIME_LIMIT, autoescape=True),
            )
        ).all()
        for job in stopped:
            told = self.executor.stopped_by(job)
            if told is None or not (told.resume or (job.error or "").startswith(OUTSIDE_STOP)):
                continue  # a time limit's stop says it best itself
            error = told.why
            if (
                told.resume
            ):  # what the runner saw, after the cause: "...: the trainer stopped after a step, ..."
                error += ": " + (job.error or "").split(": ", 1)[-1]
            resume = RESUME_PENDING if told.resume else None
            with self.state.begin() as conn:
                if explain(conn, job.id, was=job.error or "", error=error, auto_resume=resume):
                    log.warning("job %s: %s", job.id, error)

    def _recover(self, session: Session, job: Job) -> None:
        """The runner is gone while the job still runs: replay its outbox, then settle the state."""
        run_dir = Path(job.run_dir)
        for rank in range(job.nodes):  # every node's runner keeps an outbox of its own
            outbox = _jsonl(run_dir / runfiles.ranked(runfiles.OUTBOX, rank))
            admit = [
                admitted(b, job_id=job.id, gpus=job.gpus, nodes=job.nodes, devices=self.devices)
                for b in outbox
            ]
            self._replay(job.id, [b for b in admit if b is not None])
        session.refresh(job)
        if job.status != JobStatus.running:
            return
        # The runner died without telling the result (SIGKILL): no process of the job may stay,
        # and what the trainer logged after the runner died is read from its file.
        reason = self.executor.lost(job)  # before the kill, which ends what tells it
        killed = self.executor.kill(job)
        log_path = Path(job.output_dir) / runfiles.TRAINER_LOG
        if log_path.exists():
            t = log_path.stat().st_mtime
            lines = [ln for ln in log_path.read_text(errors="replace").split("\n")[:-1] if ln.strip()]
            self._replay(
                job.id,
                [{"seq": -1, "metrics": [{"line": i, "t": t, "raw": raw} for i, raw in enumerate(lines)]}],
            )
        with self.state.begin() as conn:
            move(
                conn,
                job.id,
                JobStatus.cancelled if job.cancel_requested_at else JobStatus.failed,
                error=reason or f"runner lost (killed {killed} leftover process(es))",
            )
        log.warning("job %s: %s", job.id, reason or "runner lost")

    def _replay(self, job_id: int, batches: list[dict]) -> None:
        for fut in [self.writer.submit(job_id, b) for b in batches]:
            fut.result(timeout=120)

    def queue(self, session: Session) -> dict[int, queueplan.Spot]:
        """Every queued job's place in line and what it waits for, as the next pass sees them."""
        if not self.executor.plans_devices and not self.settings.launch_paused:
            return dict(self._spots)  # placing asks the cluster: the last pass's answer
        return queueplan.read(session, self.capacity).spots

    def _start_queued(self, session: Session) -> None:
        if self.executor.plans_devices:
            for job, devices in queueplan.read(session, self.capacity).starts:
                self._launch(session, job, devices)
            return
        queued = list(session.exec(select(Job).where(Job.status == JobStatus.queued)))
        if self.executor.owns_queue:
            self._follow_cluster_queue(session, queued)
            return
        starts, self._spots = placement.order(
            queued,
            place=self.executor.place,
            release=self.executor.release,
            backfill_max_wait_s=self.settings.backfill_max_wait_s,
        )
        for job in starts:
            self._launch(session, job, [])

    def _follow_cluster_queue(self, session: Session, queued: list[Job]) -> None:
        """Slurm keeps the queue: each job is submitted at once (`place`), in tunedeck's order; it starts
        here when the cluster started it, and waits with the cluster's reason until then."""
        spots: dict[int, queueplan.Spot] = {}
        order = sorted(queued, key=lambda j: (-queueplan.asked(j).priority, j.id))
        for position, job in enumerate(order, start=1):
            try:
                started = self.executor.place(job)
            except Exception as e:  # sbatch refused it (a limit, a partition gone since submit)
                with self.state.begin() as conn:
                    move(conn, job.id, JobStatus.failed, error=f"cannot submit the job: {e}")
                continue
            if started:
                spots[job.id] = queueplan.Spot(position, queueplan.STARTING)
                self._launch(session, job, [])
            else:
                spots[job.id] = queueplan.Spot(position, self.executor.waiting(job) or "the cluster")
        self._spots = spots

    def _launch(self, session: Session, job: Job, devices: list[int]) -> None:
        token = secrets.token_urlsafe(32)
        with self.state.begin() as conn:  # the token must be known before the runner's first batch arrives
            # An executor that submits jobs itself (Slurm) stored its runners' token hash then: kept.
            kept: dict[str, Any] = (
                {} if self.executor.owns_queue else {"runner_token_hash": token_hash(token)}
            )
            started = move(
                conn,
                job.id,
                JobStatus.running,
                devices=",".join(map(str, devices)) if devices else None,
                **kept,
            )
        session.refresh(job)
        if not started:  # cancelled since this pass read the queue
            return
        self.writer.warm()  # its store ready while the runner starts
        try:
            pid, started_at = self.executor.launch(
                job,
                devices=devices,
                token=token,
                server_url=self.settings.url,
                admit=lambda hashes: self._admit(job.id, hashes),
            )
        except Exception as e:  # OSError here; on Ray, an actor that could not start
            self.executor.kill(job)
            with self.state.begin() as conn:
                move(conn, job.id, JobStatus.failed, error=f"cannot start runner: {e}")
            return
        job.runner_pid, job.runner_started = pid, started_at
        session.add(job)
        session.commit()
        log.info("job %s started: runner pid %s, devices %s", job.id, pid, devices or "cpu")

    def _admit(self, job_id: int, hashes: list[str]) -> None:
        """The hashes of the tokens a job's nodes made for their runners (Ray: each rank its own, so the
        server never holds them): the telemetry route takes these instead of the one made here."""
        with self.engine.begin() as conn:
            jobs = core(Job)
            res = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.status == JobStatus.running.name)
                .values(runner_token_hash=" ".join(hashes))
            )
        if res.rowcount == 0:
            raise RuntimeError("the job ended while its runners were being started")


def _jsonl(path: Path) -> list[dict]:
    """The whole lines of a JSONL file; a torn last line (a writer killed mid-write) is skipped."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text(errors="replace").splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def _aware(dt: datetime) -> datetime:
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)  # SQLite returns naive datetimes
