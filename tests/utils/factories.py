"""Rows made the way the server makes them (through our services), for tests that need data in place."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine
from sqlmodel import Session

from tunedeck import procs
from tunedeck.api import auth
from tunedeck.checks.submission import Node
from tunedeck.config import Settings
from tunedeck.schemas import JobSpec
from tunedeck.services.jobs import imports
from tunedeck.services.jobs import records as jobs
from tunedeck.services.jobs.jobstate import JobState, move
from tunedeck.store.hashes import token_hash
from tunedeck.store.tables import Job, JobStatus


def running_job_database(path: Path) -> Engine:
    """A migrated SQLite file holding one running job (id 1) and nothing else: for the ingest writer
    and its store, without a submission's run folder."""
    from sqlalchemy import text

    from tunedeck.store.db import make_engine, upgrade

    engine = make_engine(path)
    upgrade(engine)
    with engine.begin() as c:
        c.execute(
            text(
                "INSERT INTO jobs (name, status, gpus, spec, train_yaml, run_dir, output_dir, created_at) "
                "VALUES ('j', 'running', 0, '{}', '', '', '', '2026-01-01 00:00:00')"
            )
        )
    return engine


def create_token(engine: Engine, name: str, role: str = "submitter") -> str:
    """A bearer token as `tunedeck token create` makes it; returns its value."""
    with Session(engine) as session:
        return auth.create_token(session, name=name, role=auth.Role(role))


def create_job(
    engine: Engine,
    settings: Settings,
    *,
    config: dict[str, Any],
    name: str = "job",
    kind: str = "train",
    deepspeed: str | dict | None = None,
    gpus: int = 0,
    owner: str | None = None,
    node_gpus: int = 0,
    runner_token: str | None = None,
    **columns: Any,
) -> Job:
    """A job as a submission makes it (lint, run folder, train.yaml), then any column a test needs.

    `runner_token` is the credential the scheduler hands the job's runner when it starts it, for
    `post_telemetry`: such a job is running, as after a launch, and a live process stands in for its
    runner (so the scheduler does not find the runner lost)."""
    spec = JobSpec(name=name, kind=kind, config=config, deepspeed=deepspeed, gpus=gpus)
    with Session(engine) as session:
        job, _ = jobs.create_job(
            session, settings=settings, spec=spec, node=Node(gpus=node_gpus), owner=owner
        )
        if runner_token is not None:
            standin = _standin_runner()
            with JobState(engine).begin() as conn:
                move(
                    conn,
                    job.id,
                    JobStatus.running,
                    runner_token_hash=token_hash(runner_token),
                    runner_pid=standin.pid,
                    runner_started=procs.create_time(standin.pid),
                )
            session.refresh(job)
        for key, value in columns.items():
            if key not in Job.model_fields:
                raise TypeError(f"Job has no column {key!r}")
            setattr(job, key, value)
        session.add(job)
        session.commit()
        session.refresh(job)
        return job


_standins: list[subprocess.Popen] = []


def _standin_runner() -> subprocess.Popen:
    """A process that lives until its job's cancel signals it, or until this test process ends (its
    stdin closes then): nothing is left behind."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    _standins.append(p)
    return p


def telemetry_batch(
    *,
    seq: int,
    start_line: int = 0,
    points: Sequence[dict] = (),
    logs: Sequence[str] = (),
    memory: Sequence[dict] = (),
    states: Sequence[dict] = (),
    t: float = 1_800_000_000.0,
) -> dict[str, Any]:
    """A runner's batch: `points` are trainer_log.jsonl lines (dicts), `logs` output lines, both
    numbered from `start_line` as a runner numbers the lines it read; `memory` and `states` go as
    they are (models.MemoryIn, models.RunnerState)."""
    return {
        "seq": seq,
        "metrics": [{"line": start_line + i, "t": t + i, "raw": json.dumps(p)} for i, p in enumerate(points)],
        "logs": [
            {"line": start_line + i, "t": t + i, "stream": "stdout", "text": s} for i, s in enumerate(logs)
        ],
        "memory": list(memory),
        "states": list(states),
    }


def post_telemetry(client: httpx.Client, job_id: int, runner_token: str, **batch: Any) -> httpx.Response:
    """A runner's batch (telemetry_batch, from the same keywords) through the telemetry route."""
    batch = telemetry_batch(**batch)
    return client.post(
        f"/api/jobs/{job_id}/telemetry", json=batch, headers={"Authorization": f"Bearer {runner_token}"}
    )


def create_import(engine: Engine, settings: Settings, folder: Path, *, name: str = "imported run") -> Job:
    """A finished job from an outside run folder (output/trainer_log.jsonl, memory.csv, train.yaml,
    output/train.log; the last three optional), as `POST /api/runs/import` stores it."""

    paths = {
        "trainer_log": folder / "output" / "trainer_log.jsonl",
        "memory": folder / "memory.csv",
        "config": folder / "train.yaml",
        "log": folder / "output" / "train.log",
    }
    with ExitStack() as opened:
        files = {k: opened.enter_context(open(p, "rb")) for k, p in paths.items() if p.exists()}
        job, _ = imports.import_run(engine, settings=settings, name=name, files=files)
    return job
