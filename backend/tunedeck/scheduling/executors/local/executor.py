"""Local executor: each job's runner is a subprocess on this host, in a session of its own.

Runners outlive the server on purpose (a restart must not stop training); a restarted server
finds them again by PID and start time.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunedeck import procs
from tunedeck.checks import kinds, spec
from tunedeck.config import Settings
from tunedeck.contract import runfiles
from tunedeck.contract.protocol import RunnerConfig
from tunedeck.planning import queueplan
from tunedeck.scheduling.executors.base import Stopped
from tunedeck.services.views.nodes import NodeInventory
from tunedeck.store.tables import Job


def cpu_threads(cpu_slots: int) -> int:
    """Threads for each CPU job: jobs side by side that each take every core run many times slower."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(1, cores // cpu_slots)


def runner_config(
    s: Settings, job: Job, *, server_url: str, env: dict[str, str], bus_ids: list[str], **more
) -> RunnerConfig:
    """A runner's configuration from the settings; `more`: a rank's own (rank, job_key, ...)."""
    return RunnerConfig(
        job_id=job.id,
        job_key=more.pop("job_key", job.run_dir),
        server_url=server_url,
        output_dir=job.output_dir,
        train_python=str(s.train_python),
        command=kinds.of(job.kind).command,
        env=env,
        abort_grace_s=s.cancel_abort_grace_s,
        term_grace_s=s.cancel_term_grace_s,
        flush_s=s.telemetry_flush_s,
        batch_max=s.telemetry_batch_max,
        poll_s=s.runner_poll_s,
        watch=s.runner_watch,
        retry_max_s=s.runner_retry_max_s,
        give_up_s=s.runner_give_up_s,
        unreachable_s=s.runner_unreachable_s,
        transport=s.runner_transport,
        memory_sample_s=s.memory_sample_s,
        memory_polls=s.memory_polls,
        rlimit_as_bytes=s.trainer_rlimit_as_bytes,
        bus_ids=bus_ids,
        **more,
    )


class LocalExecutor:
    name = "local"
    plans_devices = True
    owns_queue = False

    def __init__(self, settings: Settings, inventory: NodeInventory | None = None):
        self.settings = settings
        self.inventory = inventory  # the devices' PCI bus ids, for the runner's memory sampler
        self.node_source = inventory
        self._children: dict[int, subprocess.Popen] = {}

    def cluster(self) -> None:
        return None  # this host is the only node: the submit checks read its own GPUs

    def workspace_problems(self, gpus: int, nodes: int) -> list[dict[str, Any]]:
        return []  # the runner runs where the server does: it reads the workspace the server writes

    def submit_problems(self, spec: Any, gpus: int) -> None:
        return None  # the generic checks of cluster()

    def waiting(self, job: Job) -> None:
        return None

    def place(self, job: Job) -> bool:
        return True  # queueplan chose free devices of this host

    def release(self, job: Job) -> None:
        pass

    def lost(self, job: Job) -> str | None:
        return None

    def stopped_by(self, job: Job) -> Stopped | None:
        return None  # a signal on this host comes from this host: nothing more to tell

    def sweep(self, active: set[int]) -> None:
        pass

    def launch(
        self,
        job: Job,
        *,
        devices: list[int],
        token: str,
        server_url: str,
        admit: Callable[[list[str]], None],
    ) -> tuple[int, float | None]:
        run_dir = Path(job.run_dir)  # `token` goes to the runner through a pipe: nothing to admit
        s = self.settings
        env = spec.launch_env(
            gpus=job.gpus,
            devices=devices,
            deepspeed=job.ds_config is not None,
            offline=not s.allow_hub,
            job_env=queueplan.asked(job).env,
            cpu_threads=cpu_threads(s.cpu_slots),
        )
        env.update(kinds.launch_env(job))  # a chat job's port and key, set on `job` for the proxy
        runner_config(
            s,
            job,
            server_url=server_url,
            env=env,
            bus_ids=self.inventory.bus_ids(devices) if self.inventory is not None and devices else [],
        ).write(run_dir)
        log = run_dir / runfiles.RUNNER_LOG
        p = procs.start_runner(str(s.train_python), str(run_dir), [], job.run_dir, token, log)
        self._children[job.id] = p
        return p.pid, procs.create_time(p.pid)

    def reap(self) -> None:
        """Collect exit statuses of runners this server started (no zombies)."""
        for job_id, p in list(self._children.items()):
            if p.poll() is not None:
                del self._children[job_id]

    def alive(self, job: Job) -> bool:
        self.reap()
        return procs.alive(job.runner_pid, job.runner_started)

    def cancel(self, job: Job) -> None:
        """SIGTERM to the runner: it runs the graceful SIGABRT → SIGTERM → SIGKILL sequence."""
        if job.runner_pid is not None and self.alive(job):
            try:
                os.kill(job.runner_pid, signal.SIGTERM)
            except OSError:
                pass

    def kill(self, job: Job) -> int:
        """SIGKILL the runner and every process of the job."""
        # The trainer pid is what the runner reported: signal it (and its group) only if it is the job's.
        root = job.trainer_pid if procs.carries_key(job.trainer_pid, job.run_dir) else None
        n = procs.kill_job(job.run_dir, root_pid=root)
        self.reap()
        return n
