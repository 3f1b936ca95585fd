"""The files transport (`runner_transport=files`): runners on compute nodes that cannot reach the
server append their batches to their outboxes in the shared run folder, and this worker reads them.

Every `outbox_poll_s`, for each running job and each of its nodes' runners, the outbox is read from
where the last pass stopped, whole lines only (a line still being written, or cut by a kill, waits
for the next pass), each taken as the telemetry route would take it (replay.admitted) and stored by
the same writer. Nothing is lost: a runner appends and syncs a batch before it goes on, and a pass
moves its place in a file only once what it read is committed. Nothing is stored twice: every item
has a natural key (its line number), so a file read again from the start (after a restart, which
forgets the places) stores nothing new. The scheduler still replays the outbox when it finds a
runner gone; the two meet on those keys too.

Stack dumps take the same road: the newest request of a running job is written to its run folder
(runfiles.STACKS_ASKED), each runner leaves its report there (runfiles.STACKS_REPORT), and a report
for a request that was asked is kept as the stacks route keeps one.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy import Engine, select

from tunedeck.config import Settings
from tunedeck.contract import runfiles
from tunedeck.contract.stacks import StackReport
from tunedeck.services.ingest.devices import Devices
from tunedeck.services.ingest.replay import admitted, lines
from tunedeck.services.ingest.writer import IngestWriter
from tunedeck.services.jobs.stacks import StackStore
from tunedeck.store.tables import Job, JobStatus, core
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.services.ingest.outboxes")
READ_MAX = 8 << 20  # bytes of one outbox per pass: a long file read again after a restart goes in parts
REPORT_MAX = 16 << 20  # a stack report larger than this is not read
STORE_WAIT_S = 120.0
JOBS = core(Job)


@dataclass(frozen=True)
class Running:
    id: int
    run_dir: str
    gpus: int
    nodes: int


class OutboxReader(Worker):
    name = "outbox-reader"

    def __init__(
        self,
        *,
        engine: Engine,
        settings: Settings,
        writer: IngestWriter,
        devices: Devices | None,
        stacks: StackStore,
    ):
        super().__init__()
        self.engine = engine
        self.writer = writer
        self.devices = devices
        self.stacks = stacks
        self.interval_s = settings.outbox_poll_s
        self._places: dict[tuple[int, int], tuple[int, int]] = {}  # (job, rank): (inode, bytes read)
        self._told: dict[int, int] = {}  # job: the stack-dump request written to its run folder
        self._reports: dict[tuple[int, int], int] = {}  # (job, rank): the report file's mtime taken

    def run_once(self) -> None:
        jobs = self._running()
        for job in jobs:
            for rank in range(job.nodes):
                if self.stopping:
                    return
                self._read(job, rank)
                self._take_report(job, rank)
            self._tell(job)
        alive = {j.id for j in jobs}
        for key in [k for k in self._places if k[0] not in alive]:
            del self._places[key]
        for key in [k for k in self._reports if k[0] not in alive]:
            del self._reports[key]
        for job_id in [j for j in self._told if j not in alive]:
            del self._told[job_id]

    def _running(self) -> list[Running]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(JOBS.c.id, JOBS.c.run_dir, JOBS.c.gpus, JOBS.c.nodes).where(
                    JOBS.c.status == JobStatus.running
                )
            ).all()
        return [Running(r.id, r.run_dir, r.gpus, r.nodes) for r in rows if r.run_dir]

    # ------------------------------------------------------------------ batches
    def _read(self, job: Running, rank: int) -> None:
        path = Path(job.run_dir) / runfiles.ranked(runfiles.OUTBOX, rank)
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed below; the stat must be of this open file)
        except FileNotFoundError:
            return  # the runner has not written yet
        except OSError as e:
            log.warning("job %s: cannot read %s: %s", job.id, path, e)
            return
        with f:
            st = os.fstat(f.fileno())
            inode, done = self._places.get((job.id, rank), (st.st_ino, 0))
            if inode != st.st_ino or st.st_size < done:  # another file under the name: from its start
                done = 0
            f.seek(done)
            data = f.read(READ_MAX)
        end = data.rfind(b"\n")
        if end < 0:
            return  # no whole line yet
        batches = [
            b
            for b in (
                admitted(x, job_id=job.id, gpus=job.gpus, nodes=job.nodes, devices=self.devices)
                for x in lines(data[: end + 1])
            )
            if b is not None
        ]
        for fut in [self.writer.submit(job.id, b) for b in batches]:
            fut.result(timeout=STORE_WAIT_S)  # committed: only then is the place moved past it
        self._places[(job.id, rank)] = (st.st_ino, done + end + 1)
        if len(data) == READ_MAX:
            self.wake()  # more of it waits: the next pass at once

    # ------------------------------------------------------------------ stack dumps
    def _tell(self, job: Running) -> None:
        asked = self.stacks.asked(job.id)
        if asked is None or self._told.get(job.id) == asked:
            return
        path = Path(job.run_dir) / runfiles.STACKS_ASKED
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            tmp.write_text(f"{asked}\n")
            os.replace(tmp, path)
        except OSError as e:
            log.warning("job %s: cannot ask its runners for stack dump %s: %s", job.id, asked, e)
            return
        self._told[job.id] = asked

    def _take_report(self, job: Running, rank: int) -> None:
        path = Path(job.run_dir) / runfiles.ranked(runfiles.STACKS_REPORT, rank)
        try:
            st = path.stat()
        except OSError:
            return
        if self._reports.get((job.id, rank)) == st.st_mtime_ns:
            return
        self._reports[(job.id, rank)] = st.st_mtime_ns
        if st.st_size > REPORT_MAX:
            log.warning("job %s: rank %s's stack report is %s bytes: not read", job.id, rank, st.st_size)
            return
        try:
            report = StackReport.model_validate_json(path.read_bytes())
        except (OSError, ValidationError) as e:
            log.warning("job %s: rank %s's stack report is not one: %s", job.id, rank, e)
            return
        asked = self.stacks.asked(job.id)
        if asked is None or report.request > asked or report.runner_rank != rank:
            log.warning("job %s: a stack report for request %s that was not asked", job.id, report.request)
            return
        self.stacks.save(job.id, report)
