"""What the REST API takes and answers (pydantic): the job spec, pages of rows, alerts.

Tables are in tables.py; what runners send is in protocol.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ValidationInfo, field_validator
from pydantic import Field as PField

from tunedeck import tree
from tunedeck.protocol import Strict
from tunedeck.queueplan import Spot, asked
from tunedeck.tables import Job, JobStatus

NonFinite = Literal["inf", "-inf", "nan"]


# The one rule for job names, wherever a name comes in (JSON, the YAML route's query, an import's form):
# names become folder names and appear in pages, so no slashes, markup or other scripts.
NAME_RULES: dict[str, Any] = {
    "min_length": 1,
    "max_length": 100,
    "pattern": r"^[A-Za-z0-9][A-Za-z0-9 ._+-]*$",
    "description": "letters, digits, space and . _ + -; starting with a letter or digit",
}


class JobSpec(Strict):
    """What a client submits. `config` holds LLaMA-Factory train keys, as in its YAML files."""

    name: str = PField(**NAME_RULES)
    config: dict[str, Any]
    deepspeed: str | dict[str, Any] | None = None
    gpus: int | None = PField(
        None, ge=0, le=64, description="GPUs for the job; 0 = CPU; default 1 on a GPU node"
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


class JobOut(BaseModel):
    id: int
    name: str
    owner: str | None
    status: JobStatus
    gpus: int
    devices: list[int] | None
    exit_code: int | None
    error: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    progress: Progress
    run_dir: str
    output_dir: str
    priority: int = 0
    queue_position: int | None = PField(None, description="a queued job's place in line: 1 starts next")
    waiting_for: str | None = PField(None, description="why a queued job has not started, in words")

    @classmethod
    def of(cls, job: Job) -> JobOut:
        return cls(
            id=job.id,
            name=job.name,
            owner=job.owner,
            status=job.status,
            gpus=job.gpus,
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
            priority=asked(job).priority,
        )

    def placed(self, spots: Mapping[int, Spot]) -> JobOut:
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
    nonfinite: dict[str, NonFinite] | None = PField(
        None, description='the keys above that are null because the value was not finite: {"loss": "inf"}'
    )

    @field_validator("nonfinite", mode="before")
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
    gpu: int
    used_bytes: int
    total_bytes: int | None
    util: float | None
    power_w: float | None
    temp_c: float | None


class MemoryGpu(BaseModel):
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
    gpu: int | None
    t: float
    step: int | None
    message: str
    suggestion: str | None
    open: bool
    first_t: float
    last_t: float
    count: int
