"""Slurm executor: each job is one batch job (`sbatch`, at once), and `srun --ntasks-per-node=1` in
it starts one runner per node. Slurm owns placement and the queue's order: a job stays `queued` here
with squeue's reason in words until Slurm starts it.

Everything about a job that a restarted server needs is in its run folder (`slurm.json`: the Slurm
job id and its runners' token hash), which every node sees: the server follows its Slurm jobs again
by id. The run folder must be on storage the nodes share, as on Ray.
"""

from __future__ import annotations

import getpass
import hashlib
import json
import logging
import math
import os
import re
import secrets
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import update
from sqlalchemy.engine import Engine

from tunedeck import procs
from tunedeck.checks import spec as specs
from tunedeck.config import Settings
from tunedeck.contract import runfiles
from tunedeck.planning import queueplan
from tunedeck.planning.placement import ClusterNode
from tunedeck.problems import detail
from tunedeck.scheduling.executors.base import Stopped
from tunedeck.scheduling.executors.local.executor import runner_config
from tunedeck.scheduling.executors.slurm import node as on_node
from tunedeck.scheduling.executors.slurm.cluster import (
    ENDED,
    PENDING,
    Cluster,
    JobState,
    Queued,
    SlurmError,
    run,
    seconds,
)
from tunedeck.scheduling.executors.slurm.nodes import SlurmNodes
from tunedeck.scheduling.executors.slurm.script import BatchJob, nice
from tunedeck.store.hashes import token_hash
from tunedeck.store.tables import Job, JobStatus, core

log = logging.getLogger("tunedeck.slurm")
SCRIPT = runfiles.BATCH_SCRIPT  # in the run folder, and shown by GET /api/jobs/{id}/config
RECORD = "slurm.json"  # {"job_id": ..., "token_sha256": ...}: what a restarted server follows
OUTPUT = "slurm-%j.out"  # the batch step's own output (srun's, the node tasks')
QUEUE_S = 1.0  # one squeue for every job of ours per this long, however many jobs ask
SWEEP_S = 5.0
ORPHAN_GRACE_S = 60.0
JOB_NAME = re.compile(r"^tunedeck-(\d+)$")
# How Slurm itself ends a job's allocation, in squeue's states: what a runner that saw only a signal
# (a stop from outside tunedeck) cannot tell. Not CANCELLED: the sweep's own scancel ends jobs so.
STOPPED_BY_SLURM = frozenset({"NODE_FAIL", "TIMEOUT", "PREEMPTED", "DEADLINE"})
# squeue's reasons a user meets most, in words (the code stays beside them: it is what Slurm's
# documentation and admins use).
REASONS = {
    "Priority": "jobs of higher priority are ahead of it",
    "Resources": "the nodes it needs are busy",
    "None": "Slurm has not yet looked at it",
    "Dependency": "it waits for another job",
    "BeginTime": "its start time has not come",
    "ReqNodeNotAvail": "a node it needs is down, drained or reserved",
    "PartitionNodeLimit": "it asks for more nodes than its partition allows",
    "PartitionTimeLimit": "its time limit exceeds its partition's",
    "PartitionDown": "its partition is down",
    "QOSMaxGRESPerUser": "its QOS limits the GPUs one user may hold",
    "QOSMaxJobsPerUserLimit": "its QOS limits how many jobs one user may run",
    "AssocGrpGRES": "its account's GPU limit is reached",
    "JobHeldUser": "it is held (scontrol release)",
    "JobHeldAdmin": "an administrator holds it",
}


def reason_words(reason: str) -> str:
    words = REASONS.get(reason)
    return f"Slurm: {reason}" + (f" ({words})" if words else "")


class SlurmExecutor:
    name = "slurm"
    plans_devices = False
    owns_queue = True

    def __init__(self, settings: Settings, *, engine: Engine, slurm: Cluster | None = None):
        self.settings, self.engine = settings, engine
        self.slurm = slurm or Cluster()
        self.user = getpass.getuser()
        # Marks this server's jobs in squeue: one workspace on one host is one server.
        where = f"{socket.gethostname()}:{settings.workspace.resolve()}"
        self.comment = f"tunedeck:{hashlib.sha256(where.encode()).hexdigest()[:16]}"
        self.node_source = SlurmNodes(self.slurm, engine, cache_s=settings.nodes_cache_s)
        self._ids: dict[int, str] = {}  # tunedeck job id -> Slurm job id
        self._queue: dict[str, Queued] = {}
        self._read = -math.inf  # when squeue was last read (never: the first ask reads it)
        self._swept = -math.inf
        self._lost: dict[int, str] = {}
        self._stopped: dict[int, Stopped | None] = {}  # what scontrol told of an ended job: it stays so
        self._orphans: dict[str, float] = {}  # Slurm id -> when the sweep first found it orphaned

    # ------------------------------------------------------------------ the cluster
    def cluster(self) -> list[ClusterNode]:
        return [
            ClusterNode(
                name=n.name, ip=n.addr, gpus=n.gpus, cpus=float(n.cpus), alive=n.usable, node_id=n.name
            )
            for n in self.slurm.nodes()
        ]

    def workspace_problems(self, gpus: int, nodes: int) -> list[dict[str, Any]]:
        return []  # checked with the cluster's own view in submit_problems

    def submit_problems(self, spec: Any, gpus: int) -> list[dict[str, Any]]:
        """The job's partition, GPUs per node, node count and features against what Slurm says."""
        asked = self._slurm_options(spec.slurm.model_dump() if spec.slurm else {})
        try:
            nodes = self.slurm.nodes()
            partitions = self.slurm.partitions(nodes)
        except SlurmError as e:
            return [detail(["slurm"], f"the Slurm cluster cannot be read: {e}")]
        loc = ["slurm", "partition"] if spec.slurm and spec.slurm.partition else ["slurm"]
        if asked["partition"] is None:
            part = next((p for p in partitions if p.default), None)
            if part is None:
                names = ", ".join(p.name for p in partitions) or "none"
                return [
                    detail(
                        ["slurm", "partition"], f"the cluster has no default partition; name one of: {names}"
                    )
                ]
        else:
            part = next((p for p in partitions if p.name == asked["partition"]), None)
            if part is None:
                names = ", ".join(p.name for p in partitions) or "none"
                return [detail(loc, f"no Slurm partition {asked['partition']!r}; the cluster has: {names}")]
        members = [n for n in nodes if n.name in part.nodes]
        limit, most_s = seconds(asked["time"] or ""), seconds(part.max_time)
        if limit is not None and most_s is not None and limit > most_s:
            where = ["slurm", "time"] if spec.slurm and spec.slurm.time else ["slurm"]
            return [
                detail(
                    where,
                    f"asks for a time limit of {asked['time']}; partition {part.name} allows at most "
                    f"{part.max_time}",
                )
            ]
        if asked["constraint"]:
            features = sorted({f for n in members for f in n.features})
            unknown = [w for w in re.findall(r"[A-Za-z_][\w.-]*", asked["constraint"]) if w not in features]
            if unknown:
                return [
                    detail(
                        ["slurm", "constraint"],
                        f"no node of partition {part.name} has the feature(s) {', '.join(unknown)}; "
                        f"they have: {', '.join(features) or 'none'}",
                    )
                ]
            members = [n for n in members if _satisfies(asked["constraint"], n.features)]
        if not members:
            return [detail(loc, f"partition {part.name} has no node")]
        largest = max(members, key=lambda n: (n.gpus, n.cpus))
        if gpus > largest.gpus:
            return [
                detail(
                    ["gpus"],
                    f"asks for {gpus} GPUs on each node; the largest node of partition {part.name}, "
                    f"{largest.name}, has {largest.gpus}",
                )
            ]
        fit = [n for n in members if n.gpus >= gpus]
        most = min(len(fit), part.max_nodes or len(fit))
        if spec.nodes > most:
            each = f"{gpus} GPUs" if gpus else "a CPU"
            return [
                detail(
                    ["nodes"],
                    f"asks for {spec.nodes} nodes with {each} each; partition {part.name} holds {most} "
                    f"such node(s) (largest node: {largest.name}, {largest.gpus} GPUs)",
                )
            ]
        return []

    def _slurm_options(self, given: dict[str, Any]) -> dict[str, str | None]:
        s = self.settings
        defaults = {
            "partition": s.slurm_partition,
            "account": s.slurm_account,
            "qos": s.slurm_qos,
            "time": s.slurm_time,
            "constraint": None,
        }
        return {k: given.get(k) or v for k, v in defaults.items()}

    # ------------------------------------------------------------------ the queue
    def _slurm_id(self, job: Job) -> str | None:
        if job.id not in self._ids:
            try:
                self._ids[job.id] = str(json.loads((Path(job.run_dir) / RECORD).read_text())["job_id"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
        return self._ids[job.id]

    def _state(self, job: Job) -> Queued | JobState | None:
        """The job's line in squeue (read for all our jobs at most every QUEUE_S); scontrol for one
        squeue no longer lists; None when Slurm has forgotten it."""
        sid = self._slurm_id(job)
        if sid is None:
            return None
        if time.monotonic() - self._read >= QUEUE_S or sid not in self._queue:
            try:
                self._queue = self.slurm.queue(self.user)
            except SlurmError as e:
                log.warning("squeue: %s", e)
            self._read = time.monotonic()
        return self._queue.get(sid) or self.slurm.job(sid)

    def place(self, job: Job) -> bool:
        """Submitted at once (the first time); True once Slurm has started it (or ended it: the watch
        then says how)."""
        if self._slurm_id(job) is None:
            self._submit(job)
            return False
        st = self._state(job)
        if st is None:
            return True  # forgotten by Slurm: started and ended long ago; the watch settles it
        return st.state not in PENDING

    def waiting(self, job: Job) -> str | None:
        st = self._state(job)
        if st is None:
            return None
        return f"Slurm job {st.id} {st.state.lower()}: {reason_words(st.reason)}"

    def release(self, job: Job) -> None:
        pass  # Slurm keeps its queue; a job cancelled here is scancelled by the sweep

    def _submit(self, job: Job) -> None:
        run_dir, s = Path(job.run_dir), self.settings
        given = json.loads(job.spec or "{}").get("slurm") or {}
        batch = BatchJob(
            job_id=job.id,
            nodes=job.nodes,
            gpus=job.gpus,
            python=str(s.train_python),
            run_dir=str(run_dir),
            comment=self.comment,
            nice=nice(queueplan.asked(job).priority),
            warn_s=s.slurm_warn_s,
            **self._slurm_options(given),
        )
        text = batch.render()  # ValueError before anything is written for a value it cannot hold
        token = secrets.token_urlsafe(32)
        env = specs.launch_env(
            gpus=job.gpus,
            devices=list(range(job.gpus)),  # replaced on the node by what Slurm bound (node.bound_gpus)
            deepspeed=job.ds_config is not None,
            offline=not s.allow_hub,
            job_env=queueplan.asked(job).env,
            nodes=job.nodes,
        )
        for r in range(job.nodes):
            runner_config(
                s, job, server_url=s.url, env=env, bus_ids=[], rank=r, job_key=on_node.job_key(job.run_dir, r)
            ).write(run_dir)
            _private(run_dir / runfiles.ranked(on_node.TOKEN, r), token)
        (run_dir / on_node.CANCEL).unlink(missing_ok=True)
        script = run_dir / SCRIPT
        script.write_text(text)
        digest = token_hash(token)
        with self.engine.begin() as conn:  # before sbatch: the runners' first batch finds it
            jobs = core(Job)
            conn.execute(
                update(jobs)
                .where(jobs.c.id == job.id, jobs.c.status == JobStatus.queued.name)
                .values(runner_token_hash=digest)
            )
        out = self._run_sbatch(batch, script, run_dir)
        sid = out.split(";")[0].strip()  # --parsable: "id" or "id;cluster"
        (run_dir / RECORD).write_text(json.dumps({"job_id": sid, "token_sha256": digest}))
        self._ids[job.id] = sid
        self._read = -math.inf
        log.info("job %s submitted to Slurm as job %s", job.id, sid)

    def _run_sbatch(self, batch: BatchJob, script: Path, run_dir: Path) -> str:
        return run(*batch.argv(str(script), str(run_dir / OUTPUT)))

    # ------------------------------------------------------------------ launch
    def launch(
        self,
        job: Job,
        *,
        devices: list[int],
        token: str,
        server_url: str,
        admit: Callable[[list[str]], None],
    ) -> tuple[int, float | None]:
        """Slurm started the job's runners itself (the token hash was stored at submit): record where."""
        st = self._state(job)
        nodelist = st.nodelist if st is not None else ""
        try:
            names = self.slurm.hostnames(nodelist) if nodelist else []
        except SlurmError:
            names = []
        job.placement = json.dumps([{"node": n, "devices": list(range(job.gpus))} for n in names])
        log.info("job %s runs as Slurm job %s on %s", job.id, self._slurm_id(job), ", ".join(names) or "?")
        return 0, None

    # ------------------------------------------------------------------ watch and stop
    def alive(self, job: Job) -> bool:
        st = self._state(job)
        if st is None:
            self._lost[job.id] = f"Slurm job {self._slurm_id(job)} is gone (Slurm no longer knows it)"
            return False
        if st.state not in ENDED:
            return True
        self._lost[job.id] = self._why_ended(job, st)
        return False

    def _why_ended(self, job: Job, st: Queued | JobState) -> str:
        where = f"Slurm job {st.id} ended {st.state}"
        if st.state == "NODE_FAIL" or (st.reason and "Node" in st.reason):
            try:
                nodes = {n.name: n for n in self.slurm.nodes()}
                names = json.loads(job.placement or "[]")
            except (SlurmError, ValueError):
                nodes, names = {}, []
            failed = [
                f"{nodes[p['node']].name} ({nodes[p['node']].state}: {nodes[p['node']].reason or 'no reason given'})"
                for p in names
                if p.get("node") in nodes and not nodes[p["node"]].usable
            ]
            if failed:
                return f"node {', '.join(failed)} failed: {where} ({st.reason})"
        return f"{where} ({st.reason})"

    def lost(self, job: Job) -> str | None:
        return self._lost.pop(job.id, None)

    def stopped_by(self, job: Job) -> Stopped | None:
        """Why Slurm ended a job whose runner reported a stop from outside tunedeck (or the warning of
        its allocation's end), once squeue says: at a node failure Slurm signals the runners on the
        nodes left, and they report before the job reads NODE_FAIL (it is COMPLETING until its steps
        there have ended). None until then, and where Slurm ended it for no reason of its own.

        A preemption is told by scontrol's PreemptTime, whatever the end state: with the partition's
        GraceTime and the user signal sent at preemption (22.05's `SlurmctldParameters=
        preempt_send_user_signal`, later releases' `PreemptParameters=send_user_signal`) the runners
        get the `--signal` warning, stop with a checkpoint and the job ends COMPLETED within the
        grace; without them the tasks get SIGTERM and it ends PREEMPTED. Either way the next attempt
        continues from the newest checkpoint (`resume`)."""
        if job.id in self._stopped:
            return self._stopped[job.id]
        st = self._state(job)
        if st is None or st.state not in ENDED:
            return None
        sid = self._slurm_id(job)
        full = st if isinstance(st, JobState) else self.slurm.job(sid) if sid is not None else None
        told: Stopped | None = None
        if full is not None and full.preempted_at is not None:
            where = f" in partition {full.partition}" if full.partition else ""
            told = Stopped(
                f"preempted by Slurm at {full.preempted_at} (Slurm job {full.id}{where})", resume=True
            )
        elif st.state in STOPPED_BY_SLURM:
            told = Stopped(self._why_ended(job, st))
        if full is not None:
            self._stopped[job.id] = told
        return told

    def cancel(self, job: Job) -> None:
        """The graceful stop, through the run folder every node sees: each node's task sends SIGTERM to
        its runner (a Slurm signal would reach the trainers too; node.py says why)."""
        try:
            (Path(job.run_dir) / on_node.CANCEL).write_text("cancel\n")
        except OSError as e:
            log.warning("job %s: cannot ask for a graceful stop: %s", job.id, e)

    def kill(self, job: Job) -> int:
        """scancel with SIGKILL to every process of the job, on every node; then what this host runs
        of it (a node may be this host)."""
        sid = self._slurm_id(job)
        n = 0
        if sid is not None:
            try:
                self.slurm.cancel(sid, signal="KILL")
                n = job.nodes
            except SlurmError as e:
                log.info("scancel %s: %s", sid, e)
        for r in range(job.nodes):
            n += procs.kill_job(on_node.job_key(job.run_dir, r), exclude={os.getpid()})
        self._read = -math.inf
        return n

    def reap(self) -> None:
        pass

    def sweep(self, active: set[int]) -> None:
        """scancel this server's Slurm jobs whose tunedeck job is no longer queued or running."""
        if time.monotonic() - self._swept < SWEEP_S:
            return
        self._swept = time.monotonic()
        try:
            queue = self.slurm.queue(self.user)
        except SlurmError as e:
            log.warning("squeue: %s", e)
            return
        now = time.monotonic()
        orphans: dict[str, float] = {}
        for q in queue.values():
            m = JOB_NAME.match(q.name)
            if not (m and q.comment == self.comment and int(m[1]) not in active and q.state not in ENDED):
                continue
            # A job that ran: its runner reported the end and is leaving (its last batches are in);
            # it gets ORPHAN_GRACE_S to go by itself. One still pending goes at once.
            orphans[q.id] = since = self._orphans.get(q.id, now)
            if q.state not in PENDING and now - since < ORPHAN_GRACE_S:
                continue
            try:
                self.slurm.cancel(q.id)
                log.info("Slurm job %s of ended job %s cancelled", q.id, m[1])
            except SlurmError as e:
                log.info("scancel %s: %s", q.id, e)
        self._orphans = orphans


def _satisfies(constraint: str, features: tuple[str, ...]) -> bool:
    """Whether a node's features meet a constraint of `&`/`,` (and) and `|` (or) terms; anything
    fancier (counts, brackets) is Slurm's to judge: such a node counts."""
    if re.search(r"[\[\]()*]", constraint):
        return True
    return any(all(t in features for t in re.split(r"[&,]", alt) if t) for alt in constraint.split("|"))


def _private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
