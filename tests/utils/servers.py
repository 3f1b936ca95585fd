"""The shared harness of tests and benchmarks: the checkout's paths, free ports, the demo preset
pointed at the shared tiny model, and a real `tunedeck serve` process (`Server`) with helpers that
read a job the way a client does. The fixtures that build on it live in tests/conftest.py."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from tests.utils.wait import DEADLINE, until
from tunedeck.store.hashes import token_hash

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
OUTPUT = ROOT / "test-output"
CONFIGS = ROOT / "configs"  # the presets, shipped inside the package as tunedeck.configs


# Ports the tests pick themselves: below the kernel's ephemeral range (32768 up), which every bind to
# port 0 and every outgoing connection draws from, and above Ray's worker ports (10002-19999). Each
# pytest-xdist worker takes its own slice, so two workers never pick the same port, and walks it from
# a random place, so two runs on one machine rarely meet.
PORTS = range(20000, 32000)
_next_port: list[int] = []


def _port_slice() -> range:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    width = len(PORTS) // max(workers, 1)
    return range(PORTS.start + index * width, PORTS.start + (index + 1) * width)


def free_port() -> int:
    """A port nothing listens on now, which this process has not handed out lately."""
    ports = _port_slice()
    if not _next_port:
        _next_port.append(random.randrange(len(ports)))
    for _ in range(len(ports)):
        port = ports[_next_port[0] % len(ports)]
        _next_port[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # taken (or still closing): the next one
            return port
    raise RuntimeError(f"no free port in {ports}")


def demo_config(assets: Path, **overrides) -> dict:
    """The CPU demo preset, pointed at the shared assets, with fewer steps for tests."""
    config = yaml.safe_load((CONFIGS / "demo_cpu.yaml").read_text())
    config["model_name_or_path"] = str(assets / "demo" / "model")
    config["dataset_dir"] = str(assets / "demo" / "data")
    config.update({"max_steps": 20, "logging_steps": 2, "eval_steps": 10, "save_steps": 10})
    config.update(overrides)
    return config


def zero3() -> dict:
    """The seed's ZeRO-3 DeepSpeed config (the ds_z3_rocm preset), fp16 off for the CPU."""
    ds = json.loads((CONFIGS / "ds_z3_rocm.json").read_text())
    ds["fp16"]["enabled"] = False
    return ds


class Server:
    """A real `tunedeck serve` process with its own workspace and SQLite file."""

    def __init__(self, workspace: Path, assets: Path, **env: str):
        self.workspace = workspace
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "TUNEDECK_WORKSPACE": str(workspace),
            "TUNEDECK_PORT": str(self.port),
            "TUNEDECK_ALLOWED_ROOTS": json.dumps([str(assets)]),
            "TUNEDECK_SCHEDULER_INTERVAL_S": "0.3",
            "TUNEDECK_RUNNER_RETRY_MAX_S": "1",
            **env,
        }
        self.command = [PYTHON, "-m", "tunedeck.cli.main", "serve"]
        self.proc: subprocess.Popen | None = None
        # X-Tunedeck: the server refuses writes without it (a cross-site page cannot send it). The
        # timeout only bounds a hang: on a loaded machine a submit to a Ray cluster (its state API,
        # the workspace probe) took over 30 s.
        self.api = httpx.Client(base_url=self.url, timeout=DEADLINE, headers={"X-Tunedeck": "1"})

    def start(self) -> "Server":
        self.workspace.mkdir(parents=True, exist_ok=True)
        log = open(self.workspace / f"server-{time.time():.0f}.log", "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            self.command, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        until(self._healthy, "healthy server")
        return self

    def _healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"server exited with {self.proc.returncode}")
        try:
            return self.api.get("/api/health").status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL, no cleanup: what a crash looks like."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def submit(self, spec: dict) -> dict:
        r = self.api.post("/api/jobs", json=spec)
        assert r.status_code == 201, r.text
        return r.json()

    def wait(self, job_id: int, statuses: tuple[str, ...], timeout: float = 240) -> dict:
        def reached() -> dict | None:
            job = self.api.get(f"/api/jobs/{job_id}").json()
            return job if job["status"] in statuses else None

        return until(
            reached,
            f"job {job_id} {'/'.join(statuses)}",
            timeout=timeout,
            interval=0.3,
            explain=lambda: self.explain(job_id),
        )

    def explain(self, job_id: int, lines: int = 30) -> str:
        """Where a job stands, for a timeout's message: its status, why it waits, its last log lines."""
        job = self.api.get(f"/api/jobs/{job_id}").json()
        logs = self.all(job_id, "logs")
        tail = "\n".join(f"  | {g['text']}" for g in logs[-lines:])
        return (
            f"job {job_id}: status {job['status']}, waiting_for {job.get('waiting_for')!r}, "
            f"error {job.get('error')!r}, progress {job.get('progress')}\nlast log lines:\n{tail}"
        )

    def all(self, job_id: int, what: str) -> list[dict]:
        """Every page of a job's metrics or logs, following the cursor."""
        key = "points" if what == "metrics" else "lines"
        out, after = [], None
        while True:
            page = self.api.get(
                f"/api/jobs/{job_id}/{what}", params={"limit": 100, **({"after": after} if after else {})}
            ).json()
            out += page[key]
            if not page[key]:
                return out
            after = page["next"]


def runner_token(server: Server, job_id: int, timeout: float = 180) -> str:
    """A token for the running job's telemetry route, as its runner holds one.

    The server hands the real one to the runner alone (never to a file), so the test swaps the
    stored hash for its own token's once the job runs; the real runner's later batches are refused."""
    import secrets
    import sqlite3
    from contextlib import closing

    server.wait(job_id, ("running",), timeout=timeout)
    token = secrets.token_urlsafe(32)
    with closing(sqlite3.connect(server.workspace / "tunedeck.db", timeout=60)) as db, db:
        db.execute(
            "UPDATE jobs SET runner_token_hash = ? WHERE id = ?",
            (token_hash(token), job_id),
        )
    return token


def job_processes(run_dir: str, settle: float = 60.0) -> list:
    """The job's live processes, once the runner has had `settle` seconds to exit after reporting."""
    from tunedeck.procs import job_processes as find

    left: list = []

    def gone() -> bool:
        left[:] = find(run_dir)
        return not left

    with contextlib.suppress(AssertionError):  # the caller asserts on what is left, and names it
        until(gone, "the job's processes to exit", timeout=settle, interval=0.2)
    return left


def wait_buffered(run_dir: str, timeout: float = 120) -> None:
    """Wait until the job's runner appends a batch to its outbox: called with the server down, it
    proves the runner trains on and buffers while the server is away."""
    outbox = Path(run_dir) / "outbox.jsonl"

    def batches() -> int:
        return outbox.read_bytes().count(b"\n") if outbox.exists() else 0

    start = batches()
    until(lambda: batches() > start, "a batch buffered by the runner while the server was away", timeout)
