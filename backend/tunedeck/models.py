"""SQLModel tables and the API schemas built on them."""

from __future__ import annotations

import enum
import json
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    WrapValidator,
    field_validator,
)
from pydantic import Field as PField
from pydantic_core import PydanticCustomError
from sqlalchemy import BigInteger, Column, Index, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel

from tunedeck import tree


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class JobStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


class Job(SQLModel, table=True):
    __tablename__ = "jobs"
    __table_args__ = (Index("ix_jobs_status", "status"), Index("ix_jobs_finished_at", "finished_at"))

    id: int | None = Field(default=None, primary_key=True)
    name: str
    owner: str | None = None
    status: JobStatus = Field(default=JobStatus.queued)
    gpus: int = 0
    spec: str = Field(sa_column=Column(Text, nullable=False))  # the submitted spec, JSON
    train_yaml: str = Field(sa_column=Column(Text, nullable=False))  # exactly what runs
    ds_config: str | None = Field(default=None, sa_column=Column(Text))
    run_dir: str = ""
    output_dir: str = ""
    devices: str | None = None  # comma-separated device indices given to the job
    exit_code: int | None = None
    error: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested_at: datetime | None = None
    # Progress, from the newest trainer_log.jsonl line.
    current_steps: int | None = None
    total_steps: int | None = None
    percentage: float | None = None
    eta_seconds: float | None = None
    # The runner process (reattach after a server restart) and its credentials.
    runner_pid: int | None = None
    runner_started: float | None = None  # psutil create_time, guards against PID reuse
    trainer_pid: int | None = None
    runner_token_hash: str | None = None
    last_batch_seq: int = Field(default=-1, sa_column_kwargs={"server_default": "-1"})
    estimate: str | None = Field(default=None, sa_column=Column(Text))  # issue 5: VRAM estimate, JSON


class MetricPoint(SQLModel, table=True):
    """One trainer_log.jsonl line; (job_id, line) makes a resent line a no-op."""

    __tablename__ = "metric_points"
    __table_args__ = (UniqueConstraint("job_id", "line", name="uq_metric_job_line"),
                      Index("ix_metric_job_step", "job_id", "step"),
                      Index("ix_metric_nonfinite", "job_id", "id", sqlite_where=text("nonfinite IS NOT NULL")))

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    line: int  # 0-based line number in trainer_log.jsonl
    t: float  # unix time the runner read the line
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    eval_loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    throughput: float | None = None
    total_tokens: int | None = None
    vram_allocated: float | None = None  # GiB, peak since process start (RECORD_VRAM)
    vram_reserved: float | None = None
    raw: str = Field(sa_column=Column(Text, nullable=False))  # the line as written
    # The columns above hold finite numbers only; an Infinity or NaN of the line is NULL there and
    # named here, JSON such as {"loss": "inf"} (SQLite cannot store NaN, and JSON cannot carry either).
    nonfinite: str | None = Field(default=None, sa_column=Column(Text))


class LogLine(SQLModel, table=True):
    __tablename__ = "log_lines"
    __table_args__ = (UniqueConstraint("job_id", "line", name="uq_log_job_line"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    line: int  # 0-based, over stdout and stderr together, in the order the runner read them
    t: float
    stream: str  # stdout | stderr | runner
    text: str = Field(sa_column=Column(Text, nullable=False))


class JobChange(SQLModel, table=True):
    """The newest change of each job, written only by SQLite triggers on `jobs` (see migration 0004_ui).

    AUTOINCREMENT so a `seq` is never reused: streams page job changes by it."""

    __tablename__ = "job_changes"
    __table_args__ = {"sqlite_autoincrement": True}

    seq: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(unique=True)


# ---------------------------------------------------------------- API schemas

NonFinite = Literal["inf", "-inf", "nan"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# The one rule for job names, wherever a name comes in (JSON, the YAML route's query, an import's form):
# names become folder names and appear in pages, so no slashes, markup or other scripts.
NAME_RULES: dict[str, Any] = {"min_length": 1, "max_length": 100, "pattern": r"^[A-Za-z0-9][A-Za-z0-9 ._+-]*$",
                              "description": "letters, digits, space and . _ + -; starting with a letter or digit"}


class JobSpec(Strict):
    """What a client submits. `config` holds LLaMA-Factory train keys, as in its YAML files."""

    name: str = PField(**NAME_RULES)
    config: dict[str, Any]
    deepspeed: str | dict[str, Any] | None = None
    gpus: int | None = PField(None, ge=0, le=64, description="GPUs for the job; 0 = CPU; default 1 on a GPU node")

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
        )


class JobPage(BaseModel):
    jobs: list[JobOut]
    next: int | None


class JobCreated(JobOut):
    warnings: list[str] = []
    findings: list[dict] = []  # issue 5: lint warnings/info ({code, severity, path, message, fix})


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
        None, description='the keys above that are null because the value was not finite: {"loss": "inf"}')

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


class FileOut(BaseModel):
    path: str = PField(description="relative to the job's output folder")
    bytes: int


# ---------------------------------------------------------------- runner → server


class MetricIn(Strict):
    line: int = PField(ge=0, le=2**62)
    t: float = PField(allow_inf_nan=False)
    raw: str = PField(max_length=65536)


class LogIn(Strict):
    line: int = PField(ge=0, le=2**62)
    t: float = PField(allow_inf_nan=False)
    stream: str = PField(pattern="^(stdout|stderr|runner)$")
    text: str = PField(max_length=65536)


class RunnerState(Strict):
    """A runner's report about the training process."""

    event: str = PField(pattern="^(started|exited)$")
    trainer_pid: int | None = PField(None, ge=1, le=2**22, description="a Linux pid (at most PID_MAX_LIMIT)")
    exit_code: int | None = PField(None, ge=-(2**31), le=2**31)
    cancelled: bool = False
    cause: str | None = PField(None, max_length=2000)


class TelemetryBatch(Strict):
    seq: int = PField(ge=0, le=2**62)
    metrics: list[MetricIn] = PField([], max_length=20000)
    logs: list[LogIn] = PField([], max_length=20000)
    states: list[RunnerState] = PField([], max_length=10)
    memory: Annotated[list[MemoryIn] | MemoryColumns, WrapValidator(_memory_form)] = PField(
        [], description="memory samples: a list of rows, or one array per field (`MemoryColumns`, what runners send)")


# ---------------------------------------------------------------- issue 6: tokens and roles


class ApiToken(SQLModel, table=True):
    """A bearer token for people and scripts; only its SHA-256 is stored."""

    __tablename__ = "api_tokens"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True)
    role: str  # viewer | submitter | admin
    token_hash: str = Field(unique=True)
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None


# ---------------------------------------------------------------- issue 3: memory telemetry and alerts


class MemorySample(SQLModel, table=True):
    """One sampler interval of one device: the MAX seen inside it. (job_id, line) keys a resend."""

    __tablename__ = "memory_samples"
    __table_args__ = (UniqueConstraint("job_id", "line", name="uq_memory_job_line"),
                      Index("ix_memory_job_gpu_t", "job_id", "gpu", "t"))

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    line: int  # the runner's per-job sample sequence number
    t: float
    gpu: int  # device index on the node; -1 = host memory (cpu backend)
    used_bytes: int = Field(sa_type=BigInteger)
    total_bytes: int | None = Field(default=None, sa_type=BigInteger)
    util: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    name: str | None = None


class Alert(SQLModel, table=True):
    """One episode of a detected condition; open while it holds, updated while it recurs."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_job_kind", "job_id", "kind", "gpu"), Index("ix_alerts_open", "open"))

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    kind: str
    severity: str  # info | warning | critical
    gpu: int | None = None
    t: float  # the newest occurrence
    step: int | None = None
    message: str = Field(sa_column=Column(Text, nullable=False))
    suggestion: str | None = Field(default=None, sa_column=Column(Text))
    open: bool = True
    first_t: float
    last_t: float
    count: int = 1


class MemoryIn(Strict):
    line: int = PField(ge=0, le=2**62)
    t: float = PField(allow_inf_nan=False)
    gpu: int = PField(ge=-1, le=1_000_000)
    used_bytes: int = PField(ge=0, le=2**62)
    total_bytes: int | None = PField(None, ge=0, le=2**62)
    util: float | None = PField(None, allow_inf_nan=False)
    power_w: float | None = PField(None, allow_inf_nan=False)
    temp_c: float | None = PField(None, allow_inf_nan=False)
    name: str | None = PField(None, max_length=200)


SAMPLES_MAX = 20000
Count = Annotated[int, PField(ge=0, le=2**62)]
Finite = Annotated[float, PField(allow_inf_nan=False)]


class MemoryColumns(Strict):
    """Memory samples as one array per field, sample i at index i of each: validated per column in
    pydantic's core, with no object per sample, and half the bytes of the row form on the wire."""

    line: list[Count] = PField(max_length=SAMPLES_MAX)
    t: list[Finite] = PField(max_length=SAMPLES_MAX)
    gpu: list[Annotated[int, PField(ge=-1, le=1_000_000)]] = PField(max_length=SAMPLES_MAX)
    used_bytes: list[Count] = PField(max_length=SAMPLES_MAX)
    total_bytes: list[Count | None] | None = PField(None, max_length=SAMPLES_MAX)
    util: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    power_w: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    temp_c: list[Finite | None] | None = PField(None, max_length=SAMPLES_MAX)
    name: list[Annotated[str, PField(max_length=200)] | None] | None = PField(None, max_length=SAMPLES_MAX)


_MEMORY_ROWS = TypeAdapter(list[MemoryIn])


def _memory_form(value: Any, _handler: Any) -> list[MemoryIn] | MemoryColumns:
    # Each form validated on its own, so an error names the field as sent (memory.0.util or
    # memory.util.0), not a union branch.
    if not isinstance(value, dict):
        return _MEMORY_ROWS.validate_python(value)
    cols = MemoryColumns.model_validate(value)
    n = len(cols.line)
    short = [(k, len(v)) for k, v in cols if v is not None and len(v) != n]
    if short:
        raise ValidationError.from_exception_data("MemoryColumns", [
            {"type": PydanticCustomError("column_length", "`{field}` has {got} values where `line` has {want}: one per sample",
                                         {"field": k, "got": got, "want": n}),
             "loc": (k,), "input": got} for k, got in short])
    return cols


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


TelemetryBatch.model_rebuild()


# ---------------------------------------------------------------- issue 5: estimate calibration


class EstimateCalibration(SQLModel, table=True):
    """Predicted against measured peak of one finished job, so estimates can be calibrated per GPU kind."""

    __tablename__ = "estimate_calibrations"
    __table_args__ = (UniqueConstraint("job_id", name="uq_calibration_job"), Index("ix_calibration_kind", "gpu_kind"))

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    gpu_kind: str  # the device name from the SMI, or "cpu"
    predicted_bytes: int = Field(sa_type=BigInteger)
    measured_bytes: int = Field(sa_type=BigInteger)
    source: str  # memory_samples | vram_reserved
    ratio: float  # measured / predicted
    created_at: datetime = Field(default_factory=utcnow)


# ---------------------------------------------------------------- issue 6: retention


class MemoryRollup(SQLModel, table=True):
    """Count, min, max and mean of one GPU's samples over one interval, kept after raw samples go."""

    __tablename__ = "memory_rollups"
    __table_args__ = (UniqueConstraint("job_id", "gpu", "t0", name="uq_rollup_job_gpu_t0"),)

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    gpu: int
    t0: float
    t1: float
    n: int
    min_bytes: int = Field(sa_type=BigInteger)
    max_bytes: int = Field(sa_type=BigInteger)
    mean_bytes: float
