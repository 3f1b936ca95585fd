"""The actor that holds one node of a job on Ray: it starts that node's runner and answers for it.

Ray imports this module on the node (the actor is detached and named, so a restarted server finds it
again). The runner is its child and watches it: when the actor goes (killed, or its node's raylet
died), the runner ends the job's processes on that node (runner.main.watch_parent).

The actor makes its runner's token itself, on the node, and gives Ray only the token's SHA-256 (what
the server keeps of any token): the token is no argument or result of a Ray call, so neither Ray's
state API, its dashboard, nor its logs can hold it. The runner reads it from a pipe, as on one host.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
from pathlib import Path

from tunedeck import procs
from tunedeck.contract import runfiles
from tunedeck.store.hashes import token_hash


def free_port() -> int:
    """A TCP port free on this node now, for torchrun's rendezvous (node 0's)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class JobNode:
    """One rank of a job: its runner process on the node Ray placed the rank's bundle on."""

    def __init__(self, job_key: str):
        self.job_key = job_key
        self.proc: subprocess.Popen | None = None
        self._token: str | None = secrets.token_urlsafe(32)  # this rank's runner's; forgotten at start

    def info(self, rendezvous: bool) -> dict:
        """Where this rank landed: node id, address, host name, its GPUs (and a port for rank 0), and
        the hash of its runner's token, for the server to accept."""
        import ray  # on the node, inside the actor: Ray is there

        return {
            "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address(),
            "host": socket.gethostname(),
            "gpu_ids": [int(g) for g in ray.get_gpu_ids()],
            "port": free_port() if rendezvous else None,
            "pid": os.getpid(),
            "token_sha256": token_hash(self._token) if self._token else None,
        }

    def start(self, python: str, run_dir: str, rank: int) -> tuple[int, float | None]:
        """`python -m tunedeck.runner RUN_DIR RANK` (no shell); the token goes through its stdin."""
        if self.proc is not None:
            return self.proc.pid, procs.create_time(self.proc.pid)
        token, self._token = self._token, None
        if token is None:
            raise RuntimeError("this rank's runner token was handed out already")
        log = Path(run_dir) / runfiles.ranked(runfiles.RUNNER_LOG, rank)
        self.proc = procs.start_runner(python, run_dir, [str(rank)], self.job_key, token, log)
        return self.proc.pid, procs.create_time(self.proc.pid)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cancel(self) -> None:
        """SIGTERM to the runner: its graceful SIGABRT → SIGTERM → SIGKILL sequence on this node."""
        proc = self.proc
        if proc is not None and proc.poll() is None:  # running
            try:
                proc.send_signal(signal.SIGTERM)
            except OSError:
                pass

    def kill(self) -> int:
        """SIGKILL the runner and every process of this rank on this node; how many there were."""
        n = procs.kill_job(self.job_key, exclude={os.getpid()})
        if self.proc is not None:
            self.proc.poll()
        return n


def read_probe(path: str) -> str:
    """What this node reads in the server's probe file (or why it cannot): is the workspace shared?"""
    try:
        return Path(path).read_text()
    except OSError as e:
        return f"cannot read {path}: {e.strerror or e}"
