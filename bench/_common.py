"""Shared by the UI benchmarks: a real server from the test fixtures, Chromium, percentiles."""

from __future__ import annotations

import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.utils.browser import ARGS, CHROMIUM
from tests.utils.servers import Server, demo_config

__all__ = ["ARGS", "CHROMIUM", "ROOT", "Server", "assets", "demo_config", "pct", "play_runner", "summary"]


def assets() -> Path:
    path = Path(os.environ.get("TUNEDECK_TEST_ASSETS", "/tmp/tdassets"))
    if not (path / "demo" / "model").exists():
        import subprocess

        subprocess.run(
            [sys.executable, "-m", "tunedeck_train.demo", "build", "--workspace", str(path)], check=True
        )
    return path


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    if not values:
        return float("nan")
    k = min(len(values) - 1, max(0, round(p / 100 * (len(values) - 1))))
    return values[k]


def summary(values: list[float], unit: str = "ms") -> str:
    if not values:
        return "no samples"
    return (
        f"n={len(values)} median={statistics.median(values):.0f}{unit} p95={pct(values, 95):.0f}{unit} "
        f"p99={pct(values, 99):.0f}{unit} max={max(values):.0f}{unit}"
    )


def play_runner(db: Path, job_id: int, token: str, **columns) -> None:
    """This process as a queued job's runner, as the scheduler records one it launched: the job
    running, the runner's token, and this process's pid and start time (so the server finds its
    runner alive and takes its batches). `columns`: more of the job's (its `gpus` a node, `nodes`)."""
    from tunedeck import procs
    from tunedeck.services.jobs.jobstate import JobState, move
    from tunedeck.store.db import make_engine
    from tunedeck.store.hashes import token_hash
    from tunedeck.store.tables import JobStatus

    engine = make_engine(db)
    try:
        with JobState(engine).begin() as conn:
            me = os.getpid()
            moved = move(
                conn,
                job_id,
                JobStatus.running,
                runner_token_hash=token_hash(token),
                runner_pid=me,
                runner_started=procs.create_time(me),
                **columns,
            )
        if not moved:
            raise RuntimeError(f"job {job_id} is not queued: it cannot be played as running")
    finally:
        engine.dispose()
