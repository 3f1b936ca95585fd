"""Process trees of a job: find them, signal them children first, make sure none outlives the job.

Every process of a job carries `TUNEDECK_JOB_KEY` in its environment. torchrun's workers run in
sessions of their own and outlive a dead parent, so a process-group signal alone can miss them;
the key finds them wherever they were reparented to.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from pathlib import Path

import psutil

JOB_KEY_ENV = "TUNEDECK_JOB_KEY"
# Server settings that are credentials: no runner or trainer inherits them.
SECRET_ENV = frozenset({"TUNEDECK_TOKEN", "TUNEDECK_WEBHOOK_URLS"})


def script(module: str) -> Path:
    """The file of a module of the trainer's package, found and not imported (it imports training
    packages, which nothing under tunedeck loads): the runner and the preflight start it by path."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(f"{module} is not installed next to tunedeck", name=module)
    return Path(spec.origin)


def trainer_env(base: dict[str, str]) -> dict[str, str]:
    """The environment a trainer may see: none of tunedeck's settings, only the job key."""
    return {k: v for k, v in base.items() if not k.startswith("TUNEDECK_") or k == JOB_KEY_ENV}


def start_runner(
    python: str, run_dir: str, args: list[str], job_key: str, token: str, log: Path
) -> subprocess.Popen:
    """`python -m tunedeck.runner RUN_DIR *args` (no shell) in a session of its own, logging to `log`."""
    env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
    env[JOB_KEY_ENV] = job_key
    with open(log, "ab") as out:
        p = subprocess.Popen(
            [python, "-m", "tunedeck.runner", run_dir, *args],
            cwd=run_dir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    # The token travels through a pipe the runner reads once: no file or environment the
    # trainer (and any code a model brings) could read holds it.
    assert p.stdin is not None  # stdin=PIPE above
    try:
        p.stdin.write(f"{token}\n".encode())
        p.stdin.close()
    except OSError:
        pass  # the runner died at once: whoever started it sees it gone, as with any runner
    return p


def alive(pid: int | None, create_time: float | None) -> bool:
    """True while the process that had this pid at `create_time` still runs (PIDs get reused)."""
    if not pid:
        return False
    try:
        p = psutil.Process(pid)
        if create_time is not None and abs(p.create_time() - create_time) > 0.01:
            return False
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def carries_key(pid: int | None, job_key: str) -> bool:
    """True when `pid` is a live process of this job (its environment holds the job's key)."""
    if not pid or pid < 1:
        return False
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE and p.environ().get(JOB_KEY_ENV) == job_key
    except (psutil.Error, OverflowError):
        return False


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def job_processes(job_key: str, *, exclude: set[int] | None = None) -> list[psutil.Process]:
    """Every live process whose environment carries this job's key."""
    exclude = exclude or set()
    found = []
    for p in psutil.process_iter():
        if p.pid in exclude:
            continue
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            if p.environ().get(JOB_KEY_ENV) == job_key:
                found.append(p)
        except psutil.Error:
            continue
    return found


def tree(
    root_pid: int, job_key: str | None = None, *, exclude: set[int] | None = None
) -> list[psutil.Process]:
    """The root, its descendants and the job's keyed processes, deepest first (children before parents)."""
    procs: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(root_pid)
        procs[root.pid] = root
        for c in root.children(recursive=True):
            procs[c.pid] = c
    except psutil.Error:
        pass
    if job_key:
        for p in job_processes(job_key, exclude=exclude):
            procs.setdefault(p.pid, p)

    def depth(p: psutil.Process) -> int:
        try:
            return len(p.parents())
        except psutil.Error:
            return 0

    return sorted(procs.values(), key=depth, reverse=True)


def training_processes(root_pid: int) -> list[psutil.Process]:
    """The processes that hold LLaMA-Factory's SIGABRT handler: torchrun's workers, else the root.

    Under torchrun the CLI and the elastic agent have no handler: SIGABRT would kill them at once
    and the workers would be torn down before they save. Without torchrun, training runs inside
    `llamafactory-cli` itself; its dataloader workers must not get the signal either.
    """
    try:
        root = psutil.Process(root_pid)
        for p in [root, *root.children(recursive=True)]:
            cmd = " ".join(p.cmdline())
            if "torchrun" in cmd or "torch.distributed.run" in cmd:
                return p.children()
        return [root]
    except psutil.Error:
        return []


def signal_all(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.Error:
            pass


def kill_job(
    job_key: str, *, root_pid: int | None = None, exclude: set[int] | None = None, timeout: float = 5.0
) -> int:
    """SIGKILL every process of the job and wait for them to go; returns how many were killed."""
    procs = tree(root_pid, job_key, exclude=exclude) if root_pid else job_processes(job_key, exclude=exclude)
    if root_pid:
        try:
            os.killpg(root_pid, signal.SIGKILL)  # the trainer leads its own session
        except OSError:
            pass
    signal_all(procs, signal.SIGKILL)
    psutil.wait_procs(procs, timeout=timeout)
    return len(procs)
