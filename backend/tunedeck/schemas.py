"""What the REST API takes and answers (pydantic): the job spec, pages of rows, alerts.

Tables are in tables.py; what runners send is in protocol.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ValidationInfo, field_validator
from pydantic import Field as PField

from tunedeck import tree
from tunedeck.alerts import Severity
from tunedeck.contract import runfiles
from tunedeck.contract.protocol import Strict
from tunedeck.planning.queueplan import Spot, asked
from tunedeck.store.tables import Job, JobStatus

_Row = TypeVar("_Row", bound="JobOut")  # JobOut or JobCreated: `of` and `placed` keep the class
NonFinite = Literal["inf", "-inf", "nan"]
JobKind = Literal["train", "eval", "predict", "export", "chat"]


# The one rule for job names, wherever a name comes in (JSON, the YAML route's query, an import's form):
# names become folder names and appear in pages, so no slashes, markup or other scripts.
NAME_RULES: dict[str, Any] = {
    "min_length": 1,
    "max_length": 100,
    "pattern": r"^[A-Za-z0-9][A-Za-z0-9 ._+-]*$",
    "description": "letters, digits, space and . _ + -; starting with a letter or digit",
}


class JobSpec(Strict):
    """What a client submits. `config` holds LLaMA-Factory keys, as in its YAML files."""

    name: str = PField(**NAME_RULES)
    kind: JobKind = PField(
        "train",
        description="train: fine-tune; eval: loss on eval_dataset; predict: generate for eval_dataset "
        "(BLEU/ROUGE); export: merge the adapter into the model; chat: an OpenAI-compatible server",
    )
    config: dict[str, Any]
    deepspeed: str | dict[str, Any] | None = None
    gpus: int | None = PField(
        None, ge=0, le=64, description="GPUs for the job; 0 = CPU; default 1 on a GPU node"
    )
    nodes: int = PField(
        1, ge=1, le=64, description="nodes the job spans, `gpus` on each (the ray executor; local: 1)"
    )
    devices: list[Annotated[int, PField(ge=0, le=1023)]] | None = PField(
        None,
        min_length=1,
        max_length=64,
        description="exactly these GPU ids (the job waits until they are free); sets `gpus`",
    )
    priority: int = PField(
        0, ge=0, le=10, description="higher starts first; equal priorities start in the order submitted"
    )
    env: dict[str, str] = PField(
        default_factory=dict,
        description="environment variables for the trainer, from an allow-list (NCCL_*, RCCL_*, HSA_*, "
        "ROCR_*, HIP_*, PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF, OMP_NUM_THREADS)",
    )

    @field_validator("config", "deepspeed")
    @classmethod
    def _plain_text(cls, v: Any, info: ValidationInfo) -> Any:
        if bad := tree.problems(v, [info.field_name]):
            raise ValueError("; ".join(reason for _, reason in bad[:5]))
        return v


class Progress(BaseModel):
    current_steps: int | None = None
    total_steps: int | None = None
    percentage: float | None = None
    eta_seconds: float | None = None


def stop_message(job: Job) -> str | None:
    """What a stopped job says: who stopped it, at which step, and whether its weights were saved."""
    if job.status != JobStatus.cancelled:
        return None
    who = f"by {job.cancelled_by}" if job.cancelled_by else "by a request without a token"
    if job.started_at is None:
        return f"cancelled {who} before it started"
    saved = runfiles.saved_weights(Path(job.output_dir)) if job.output_dir else None
    kept = f"{saved} saved" if saved else "no adapter saved"
    at = f" at step {job.current_steps}" if job.current_steps is not None else " before its first logged step"
    return f"stopped {who}{at}, {kept}"


class AlertSummary(BaseModel):
    """A job's alerts at a glance, closed ones included: a finished run keeps what went wrong."""

    worst: Severity | None = PField(None, description="the worst alert the job ever had, open or closed")
    counts: dict[str, int] = PField({}, description="alerts ever, by severity")
    open: int = PField(0, description="alerts open now")
    problems: list[str] = PField(
        [], description="kinds that make the result suspect (loss_nan, loss_divergence, loss_stuck)"
    )


class JobOut(BaseModel):
    id: int
    name: str
    kind: str = "train"
    owner: str | None
    status: JobStatus
    gpus: int
    nodes: int = 1
    devices: list[int] | None
    exit_code: int | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: Progress
    run_dir: str
    output_dir: str
    stopped: str | None = PField(
        None,
        description='a stopped job\'s "stopped by NAME at step N, adapter saved" (or "no adapter saved")',
    )
    alerts: AlertSummary = AlertSummary()
    verdict: str = PField(
        description="the status, or succeeded_with_problems for a success whose loss went NaN, "
        "diverged or stayed stuck (alerts.problems)"
    )
    parent_id: int | None = PField(None, description="the job this one resumes or was cloned from")
    tags: list[str] = []
    notes: str | None = None
    priority: int = 0
    queue_position: int | None = PField(None, description="a queued job's place in line: 1 starts next")
    waiting_for: str | None = PField(None, description="why a queued job has not started, in words")

    @classmethod
    def of(cls: type[_Row], job: Job, alerts: AlertSummary | None = None) -> _Row:
        alerts = alerts or AlertSummary()
        troubled = job.status == JobStatus.succeeded and alerts.problems
        return cls(
            id=job.id,
            name=job.name,
            kind=job.kind,
            owner=job.owner,
            status=job.status,
            gpus=job.gpus,
            nodes=job.nodes,
            devices=[int(d) for d in job.devices.split(",")] if job.devices else None,
            exit_code=job.exit_code,
            error=job.error,
            created_at=job.created_at,
            started_at=job.started_at,
            finished_at=job.finished_at,
            progress=Progress(
                current_steps=job.current_steps,
                total_steps=job.total_steps,
                percentage=job.percentage,
                eta_seconds=job.eta_seconds,
            ),
            run_dir=job.run_dir,
            output_dir=job.output_dir,
            stopped=stop_message(job),
            alerts=alerts,
            verdict="succeeded_with_problems" if troubled else job.status.value,
            parent_id=job.parent_id,
            tags=json.loads(job.tags) if job.tags else [],
            notes=job.notes,
            priority=asked(job).priority,
        )

    def placed(self: _Row, spots: Mapping[int, Spot]) -> _Row:
        """This row with its place in the queue (only a queued job has one)."""
        if (spot := spots.get(self.id)) is not None and self.status == JobStatus.queued:
            self.queue_position, self.waiting_for = spot.position, spot.waiting_for
        return self


class JobPage(BaseModel):
    jobs: list[JobOut]
    next: int | None


class JobCreated(JobOut):
    warnings: list[str] = []
    findings: list[dict] = []  # lint warnings/info ({code, severity, path, message, fix})

    @classmethod
    def made(cls, job: Job, warnings: list[str], findings: list, spots: Mapping[int, Spot]) -> JobCreated:
        """A new job's row, placed in the queue like any other, with what its checks said."""
        out = cls.of(job).placed(spots)
        out.warnings, out.findings = warnings, findings
        return out


class MetricOut(BaseModel):
    id: int
    step: int | None
    t: float
    loss: float | None
    eval_loss: float | None
    lr: float | None
    epoch: float | None
    throughput: float | None
    total_tokens: int | None
    vram_allocated: float | None
    vram_reserved: float | None
    grad_norm: float | None = None
    nonfinite: dict[str, NonFinite] | None = PField(
        None, description='the keys above that are null because the value was not finite: {"loss": "inf"}'
    )
    extra: dict[str, float] | None = PField(
        None, description="the step's other numbers as the Trainer logged them (eval_runtime, rewards, ...)"
    )

    @field_validator("nonfinite", "extra", mode="before")
    @classmethod
    def _stored(cls, v: Any) -> Any:
        return json.loads(v) if isinstance(v, str) else v


class MetricPage(BaseModel):
    points: list[MetricOut]
    next: int | None


class LogOut(BaseModel):
    id: int
    t: float
    stream: str
    text: str


class LogPage(BaseModel):
    lines: list[LogOut]
    next: int | None


class JobConfigOut(BaseModel):
    train_yaml: str
    ds_config: str | None
    run_dir: str
    output_dir: str
    env: dict[str, str] = PField({}, description="the job's own environment variables (spec `env`)")


class FileOut(BaseModel):
    path: str = PField(description="relative to the job's output folder")
    bytes: int


class MemorySampleOut(BaseModel):
    id: int
    t: float
    node: str = PField(
        "", description="the node of the runner that sampled it ('' in rows from before nodes)"
    )
    gpu: int
    used_bytes: int
    total_bytes: int | None
    util: float | None
    power_w: float | None
    temp_c: float | None


class MemoryGpu(BaseModel):
    node: str = ""
    gpu: int
    name: str | None
    total_bytes: int | None


class MemoryPage(BaseModel):
    samples: list[MemorySampleOut]
    next: int | None
    downsampled: bool
    gpus: list[MemoryGpu]


class AlertOut(BaseModel):
    id: int
    job_id: int
    kind: str
    severity: str
    node: str = ""
    gpu: int | None
    t: float
    step: int | None
    message: str
    suggestion: str | None
    change: dict[str, Any] | None = PField(
        None, description="the suggestion as train.yaml keys and new values (null: not a key change)"
    )
    open: bool
    first_t: float
    last_t: float
    count: int

    @field_validator("change", mode="before")
    @classmethod
    def _stored(cls, v: Any) -> Any:
        return json.loads(v) if isinstance(v, str) else v
