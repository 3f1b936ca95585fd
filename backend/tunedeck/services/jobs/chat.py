"""Chat jobs: a finished train or export job served by `llamafactory-cli api`, stopped when idle.

The chat server runs as a job of kind `chat` (a GPU or CPU slot like any job) and listens on
127.0.0.1 with a key only this server knows; clients reach it through tunedeck's authenticated
proxy route (api/chat.py), which also records each completion for the idle stop. A chat job is its
starter's and the served job's owner's (and admins'): it holds a GPU and answers from their adapter.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, update
from sqlmodel import Session, col, select

from tunedeck.checks.submission import Node, Submission
from tunedeck.config import Settings
from tunedeck.schemas import JobSpec
from tunedeck.services.errors import Conflict
from tunedeck.services.jobs.jobstate import JobState
from tunedeck.services.jobs.records import create_job, get_job, request_cancel
from tunedeck.store.tables import Job, JobStatus, utcnow
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.chat")
# What a chat server takes over from the job it serves (model arguments its own YAML had).
CARRIED = ("template", "finetuning_type", "trust_remote_code", "default_system", "enable_thinking")


def chat_spec(session: Session, *, job_id: int, gpus: int | None, generating: dict[str, Any]) -> JobSpec:
    """The spec of a chat job serving job `job_id`: its adapter on its base model, or its export."""
    job = get_job(session, job_id)
    out = Path(job.output_dir) if job.output_dir else None
    if job.kind not in ("train", "export") or not job.status.finished:
        raise Conflict(
            f"job {job_id} is a {job.status.value} {job.kind} job: chat serves a finished train or export job"
        )
    source = job.config()
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


def start(
    session: Session,
    *,
    settings: Settings,
    node: Node,
    job_id: int,
    gpus: int | None,
    generating: dict[str, Any],
    owner: str | None,
) -> tuple[Job, Submission]:
    """A chat job serving job `job_id`, queued like any job; it records the job it serves (its parent),
    whose owner may chat with it too."""
    spec = chat_spec(session, job_id=job_id, gpus=gpus, generating=generating)
    job, checked = create_job(session, settings=settings, spec=spec, node=node, owner=owner)
    job.parent_id = job_id
    session.add(job)
    session.commit()
    session.refresh(job)
    return job, checked


def owners(session: Session, chat: Job) -> tuple[str | None, ...]:
    """Who may chat with a chat job besides admins: whoever started it and the served job's owner."""
    served = session.get(Job, chat.parent_id) if chat.parent_id is not None else None
    return (chat.owner, served.owner if served is not None else None)


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


def answers(job: Job) -> bool:
    """Whether a chat job's model server answers on its port yet."""
    import httpx  # loaded by the first chat job, not by every server start

    if job.api_port is None:
        return False
    try:
        r = httpx.get(
            f"http://127.0.0.1:{job.api_port}/v1/models",
            headers={"authorization": f"Bearer {job.api_key}"},
            timeout=2.0,
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200


class ChatIdle(Worker):
    """Stops chat jobs that got no completion for `chat_idle_s` since their server first answered, so
    their slot goes to the queue."""

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
                if job.last_used_at is None:
                    # Loading the model is not idleness: the clock starts when its server first answers
                    # (whoever watches it load or not; it listens only once the model is loaded).
                    if answers(job):
                        touch(self.engine, job.id)
                    continue
                if now - job.last_used_at.replace(tzinfo=None) > idle:
                    log.info("chat job %s idle for %ss: stopping it", job.id, self.settings.chat_idle_s)
                    request_cancel(session, job_id=job.id, executor=self.executor, state=self.state)
