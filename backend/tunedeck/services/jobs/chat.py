"""Chat jobs: a finished train or export job served by `llamafactory-cli api`, stopped when idle.

The chat server runs as a job of kind `chat` (a GPU or CPU slot like any job) and listens on
127.0.0.1 with a key only this server knows; clients reach it through tunedeck's authenticated
proxy route (api/chat.py), which also records each use for the idle stop.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from tunedeck.config import Settings
from tunedeck.schemas import JobSpec
from tunedeck.services.errors import Conflict
from tunedeck.services.jobs.jobstate import JobState
from tunedeck.services.jobs.records import get_job, request_cancel
from tunedeck.store.tables import Job, JobStatus, utcnow
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.chat")
# What a chat server takes over from the job it serves (model arguments its own YAML had).
CARRIED = ("template", "finetuning_type", "trust_remote_code", "default_system", "enable_thinking")


def _config(job: Job) -> dict[str, Any]:
    import yaml  # loaded by the first job that needs it, not by every server start

    try:
        data = yaml.safe_load(job.train_yaml or "")
    except yaml.YAMLError:
        return {}
    return data if isinstance(data, dict) else {}


def chat_spec(session: Session, *, job_id: int, gpus: int | None, generating: dict[str, Any]) -> JobSpec:
    """The spec of a chat job serving job `job_id`: its adapter on its base model, or its export."""
    job = get_job(session, job_id)
    out = Path(job.output_dir) if job.output_dir else None
    if job.kind not in ("train", "export") or not job.status.finished:
        raise Conflict(
            f"job {job_id} is a {job.status.value} {job.kind} job: chat serves a finished train or export job"
        )
    source = _config(job)
    config = {k: source[k] for k in CARRIED if k in source}
    if job.kind == "export":
        if out is None or not (out / "config.json").is_file():
            raise Conflict(f"export job {job_id} left no model in {job.output_dir}")
        config["model_name_or_path"] = str(out)
        config.pop("finetuning_type", None)
    else:
        if out is None or not ((out / "adapter_config.json").is_file() or (out / "config.json").is_file()):
            raise Conflict(f"job {job_id} saved no model or adapter in {job.output_dir}")
        config["model_name_or_path"] = source.get("model_name_or_path")
        if (out / "adapter_config.json").is_file():
            config["adapter_name_or_path"] = str(out)
        else:  # a full fine-tune saved the whole model
            config["model_name_or_path"] = str(out)
    config.update(generating)
    return JobSpec(name=f"chat {job.name}"[:100], kind="chat", config=config, gpus=gpus)


def touch(engine: Engine, job_id: int) -> None:
    """A chat job was used now: its idle clock starts again."""
    with Session(engine) as session:
        session.exec(update(Job).where(col(Job.id) == job_id).values(last_used_at=utcnow()))
        session.commit()


def chat_target(session: Session, job_id: int) -> Job:
    """A running chat job whose server can be asked, else Conflict (409)."""
    job = get_job(session, job_id)
    if job.kind != "chat":
        raise Conflict(f"job {job_id} is a {job.kind} job, not a chat job: start one with POST .../chat")
    if job.status != JobStatus.running or job.api_port is None:
        raise Conflict(f"chat job {job_id} is {job.status.value}: its server is not running")
    return job


class ChatIdle(Worker):
    """Stops chat jobs nobody has used for `chat_idle_s`, so their slot goes to the queue."""

    name = "chat-idle"

    def __init__(self, *, engine: Engine, settings: Settings, executor, state: JobState):
        super().__init__()
        self.engine, self.settings, self.executor, self.state = engine, settings, executor, state
        self.interval_s = min(5.0, settings.chat_idle_s / 4)

    def run_once(self) -> None:
        idle = timedelta(seconds=self.settings.chat_idle_s)
        now = utcnow().replace(tzinfo=None)  # SQLite gives naive datetimes back
        with Session(self.engine) as session:
            chats = session.exec(
                select(Job).where(
                    Job.kind == "chat",
                    Job.status == JobStatus.running,
                    col(Job.cancel_requested_at).is_(None),
                )
            )
            for job in list(chats):
                last = max(
                    t.replace(tzinfo=None) for t in (job.last_used_at, job.started_at, job.created_at) if t
                )
                if now - last > idle:
                    log.info("chat job %s idle for %ss: stopping it", job.id, self.settings.chat_idle_s)
                    request_cancel(session, job_id=job.id, executor=self.executor, state=self.state)
