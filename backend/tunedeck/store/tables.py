"""The SQLite tables (SQLModel): jobs and their series, tokens, alerts, calibration, chart tiles.

Alembic's migrations create them; a test holds the two to the same schema (tests/test_migrations.py).

A table whose rows the API answers derives from a base (`AlertBase` -> `Alert`) that the answer in
schemas.py derives from too, so a field both have is declared once, with the row's type and default
(tests/test_models.py). One table per base: a field declared with `sa_column=` is one Column object,
which a second table could not take.
"""

from __future__ import annotations

import enum
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import BigInteger, Column, Index, LargeBinary, Table, Text, UniqueConstraint, text
from sqlmodel import Field, SQLModel


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


class JobBase(SQLModel):
    """A job's fields that its row and its answer (schemas.JobOut) share: declared once, here."""

    # None only until the row is inserted (the database numbers it); typed `int` because the code
    # reads jobs from the store, where every one has its id.
    id: int = Field(default=None, primary_key=True)
    name: str
    kind: str = Field(default="train", sa_column_kwargs={"server_default": "train"})  # checks/kinds.py
    owner: str | None = None
    status: JobStatus = Field(default=JobStatus.queued)
    gpus: int = 0  # on each node
    nodes: int = Field(default=1, sa_column_kwargs={"server_default": "1"})  # one runner on each
    devices: str | None = None  # comma-separated device indices given to the job
    exit_code: int | None = None
    error: str | None = None
    created_at: datetime = Field(default_factory=utcnow)
    started_at: datetime | None = None
    finished_at: datetime | None = None
    run_dir: str = ""
    output_dir: str = ""
    parent_id: int | None = Field(default=None, description="the job this one resumes or was cloned from")
    tags: str | None = Field(default=None, sa_column=Column(Text))  # JSON list of strings
    notes: str | None = Field(default=None, sa_column=Column(Text))
    # What the trainer is doing, read by its runner from its output (runner/phases.py PHASES), and
    # since when (the runner's clock as it read the line); a finished job keeps its last phase.
    phase: str | None = Field(
        default=None,
        description="what the trainer is doing, from its own output: loading_model, preparing_dataset, "
        "building_op, waiting_for_ranks, training, evaluating, predicting, saving, exporting, serving; "
        "a finished job keeps the last one (where a failed run was when it ended)",
    )
    phase_at: datetime | None = Field(default=None, description="when `phase` began (UTC)")
    auto_resume: str | None = Field(
        default=None,
        description="for a job its allocation's time limit stopped (with a checkpoint): `pending` until "
        "it is resumed, then `resumed as job N`, or why it was not",
    )


class JobProgress(SQLModel):
    """A job's progress, from the newest trainer_log.jsonl line: columns of its row, one object of its
    answer (schemas.Progress)."""

    current_steps: int | None = None
    total_steps: int | None = None
    percentage: float | None = None
    eta_seconds: float | None = None


class Job(JobProgress, JobBase, table=True):
    __tablename__ = "jobs"
    __table_args__ = (
        Index("ix_jobs_status", "status"),
        Index("ix_jobs_finished_at", "finished_at"),
        Index("ix_jobs_parent", "parent_id"),
        Index("ix_jobs_import_key", "import_key", unique=True),
    )

    spec: str = Field(sa_column=Column(Text, nullable=False))  # the submitted spec, JSON
    train_yaml: str = Field(sa_column=Column(Text, nullable=False))  # exactly what runs
    ds_config: str | None = Field(default=None, sa_column=Column(Text))
    cancel_requested_at: datetime | None = None
    cancelled_by: str | None = None  # the token name that asked for the stop (None: no token)
    # The runner process (reattach after a server restart) and its credentials.
    runner_pid: int | None = None
    runner_started: float | None = None  # psutil create_time, guards against PID reuse
    trainer_pid: int | None = None
    runner_token_hash: str | None = None  # SHA-256 hex; on Ray one per rank, space-separated
    last_batch_seq: int = Field(default=-1, sa_column_kwargs={"server_default": "-1"})
    estimate: str | None = Field(default=None, sa_column=Column(Text))  # VRAM estimate, JSON
    api_port: int | None = None  # a chat job's `llamafactory-cli api` port on 127.0.0.1
    api_key: str | None = None  # ... and the key it wants: other local users cannot use it directly
    last_used_at: datetime | None = None  # a chat job's newest proxied request (idle stop)
    # Where the executor placed it: JSON list of {"node": ..., "devices": [...]}, one per node (None: local).
    placement: str | None = Field(default=None, sa_column=Column(Text))
    # An imported run's files (and name and owner) as one hash: the same import again is this job.
    import_key: str | None = None
    # What the job's team row shows, kept up to date by ingest as each batch is stored (writer.py
    # `apply_batch`), so a row costs the same after three days as after a minute: the highest memory
    # sample, the largest device, the loss of the newest line that has one ("nan", "inf" or "-inf"
    # under `last_loss_nonfinite` when it was not a number) and that line's number.
    peak_vram_bytes: int | None = Field(default=None, sa_type=BigInteger)
    total_vram_bytes: int | None = Field(default=None, sa_type=BigInteger)
    last_loss: float | None = None
    last_loss_nonfinite: str | None = None
    last_loss_line: int | None = Field(default=None, sa_type=BigInteger)

    def config(self) -> dict[str, Any]:
        """The train.yaml that ran, as a mapping: {} when there is none or it does not parse."""
        import yaml  # loaded by the first job that needs it, not by every server start

        try:
            data = yaml.safe_load(self.train_yaml or "")
        except yaml.YAMLError:
            return {}
        return data if isinstance(data, dict) else {}


class MetricBase(SQLModel):
    """A metric point's fields that its row and its answer (schemas.MetricOut) share."""

    id: int | None = Field(default=None, primary_key=True)
    step: int | None = None
    t: float  # unix time the runner read the line
    loss: float | None = None
    eval_loss: float | None = None
    lr: float | None = None
    epoch: float | None = None
    throughput: float | None = None
    total_tokens: int | None = None
    vram_allocated: float | None = None  # GiB, peak since process start (RECORD_VRAM)
    vram_reserved: float | None = None
    grad_norm: float | None = None  # from tunedeck_log.jsonl (tunedeck_train/lf_train.py)
    # The columns above hold finite numbers only; an Infinity or NaN of the line is NULL there and
    # named here, JSON such as {"loss": "inf"} (SQLite cannot store NaN, and JSON cannot carry either).
    nonfinite: str | None = Field(default=None, sa_column=Column(Text))
    extra: str | None = Field(default=None, sa_column=Column(Text))  # its other finite numbers, JSON


class MetricPoint(MetricBase, table=True):
    """One trainer_log.jsonl line; (job_id, line) makes a resent line a no-op."""

    __tablename__ = "metric_points"
    __table_args__ = (
        UniqueConstraint("job_id", "line", name="uq_metric_job_line"),
        Index("ix_metric_job_step", "job_id", "step"),
        Index("ix_metric_nonfinite", "job_id", "id", sqlite_where=text("nonfinite IS NOT NULL")),
    )

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    line: int  # 0-based line number in trainer_log.jsonl
    total_steps: int | None = None
    raw: str = Field(sa_column=Column(Text, nullable=False))  # the line as written


class LogBase(SQLModel):
    """A log line's fields that its row and its answer (schemas.LogOut) share."""

    id: int | None = Field(default=None, primary_key=True)
    t: float
    stream: str  # stdout | stderr | runner
    text: str = Field(sa_column=Column(Text, nullable=False))


class LogLine(LogBase, table=True):
    __tablename__ = "log_lines"
    __table_args__ = (UniqueConstraint("job_id", "line", name="uq_log_job_line"),)

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    line: int  # 0-based, over stdout and stderr together, in the order the runner read them


class JobChange(SQLModel, table=True):
    """The newest change of each job, written only by SQLite triggers on `jobs` (see migration 0004_ui).

    AUTOINCREMENT so a `seq` is never reused: streams page job changes by it."""

    __tablename__ = "job_changes"
    __table_args__ = {"sqlite_autoincrement": True}

    seq: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(unique=True)


class ApiToken(SQLModel, table=True):
    """A bearer token for people and scripts; only its SHA-256 is stored."""

    __tablename__ = "api_tokens"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True)
    role: str  # viewer | submitter | admin
    token_hash: str = Field(unique=True)
    created_at: datetime = Field(default_factory=utcnow)
    revoked_at: datetime | None = None


class PresetBase(SQLModel):
    """A team preset's fields that its row and its answer (schemas.PresetOut) share."""

    name: str = Field(unique=True)
    owner: str | None = None  # the token's name; None when saved on an open server
    description: str = ""
    created_at: datetime = Field(default_factory=utcnow)


class TeamPreset(PresetBase, table=True):
    """A job YAML the team saved by name (`POST /api/presets`), checked as a submit checks it; the
    shipped presets (configs/) are files, not rows, and stay read-only."""

    __tablename__ = "team_presets"

    id: int | None = Field(default=None, primary_key=True)
    text: str


class MemoryBase(SQLModel):
    """A memory sample's fields that its row and its answer (schemas.MemorySampleOut) share."""

    id: int | None = Field(default=None, primary_key=True)
    t: float
    # '' in rows from before nodes were named: the job's one node.
    node: str = Field(
        default="",
        sa_column_kwargs={"server_default": text("''")},
        description="the node of the runner that sampled it ('' in rows from before nodes)",
    )
    gpu: int  # device index on the node; -1 = host memory (cpu backend)
    used_bytes: int = Field(sa_type=BigInteger)
    total_bytes: int | None = Field(default=None, sa_type=BigInteger)
    util: float | None = None
    power_w: float | None = None
    temp_c: float | None = Field(default=None, description="edge sensor, °C (MI300-series parts have none)")
    temp_junction_c: float | None = Field(default=None, description="junction (hotspot) temperature, °C")
    temp_hbm_c: float | None = Field(default=None, description="the hottest HBM stack, °C")
    power_shared_with: int | None = Field(
        default=None,
        description="the GPU whose power reading covers this one (an MI250X's secondary GCD reports none)",
    )
    ecc_correctable: int | None = Field(
        default=None, sa_type=BigInteger, description="since the driver loaded"
    )
    ecc_uncorrectable: int | None = Field(
        default=None, sa_type=BigInteger, description="since the driver loaded"
    )
    throttle_power: float | None = Field(
        default=None, description="share of the interval held by the power limit"
    )
    throttle_thermal: float | None = Field(default=None, description="share of the interval held by heat")
    throttle_hbm: float | None = Field(default=None, description="share of the interval held by HBM heat")
    clock_mhz: float | None = Field(default=None, description="graphics (SM) clock")
    xgmi_read_bytes: int | None = Field(
        default=None, sa_type=BigInteger, description="xGMI bytes read over every link, cumulative"
    )
    xgmi_write_bytes: int | None = Field(
        default=None, sa_type=BigInteger, description="xGMI bytes written over every link, cumulative"
    )
    serial: str | None = Field(default=None, description="board serial (sent once a device and on change)")
    uuid: str | None = Field(default=None, description="the SMI's UUID (sent once a device and on change)")
    partition: str | None = Field(default=None, description="compute/memory partition mode, e.g. CPX/NPS4")
    ecc_blocks: str | None = Field(
        default=None, description="ECC counts per block, `UMC=3/1` correctable/uncorrectable (on change)"
    )


# The memory sample columns that came with the hardware readings (migrations 0021 and 0025), in wire order.
MEMORY_TELEMETRY = (
    "temp_junction_c",
    "temp_hbm_c",
    "power_shared_with",
    "ecc_correctable",
    "ecc_uncorrectable",
    "throttle_power",
    "throttle_thermal",
    "throttle_hbm",
    "clock_mhz",
    "xgmi_read_bytes",  # migration 0025
    "xgmi_write_bytes",
    "serial",
    "uuid",
    "partition",
    "ecc_blocks",
)


class MemorySample(MemoryBase, table=True):
    """One sampler interval of one device: the MAX seen inside it. One index keys a resend (a sample
    sent again is the same sample: same node, device, time and line) and orders each device's series
    by time; a second index would double what each stored sample costs the disk's writer."""

    __tablename__ = "memory_samples"
    __table_args__ = (
        UniqueConstraint("job_id", "node", "gpu", "t", "line", name="uq_memory_job_node_gpu_t_line"),
    )

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    line: int  # the runner's sample sequence number (one sequence per node)
    name: str | None = None


class AlertBase(SQLModel):
    """An alert's fields that its row and its answer (schemas.AlertOut) share: all of them."""

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    kind: str
    severity: str  # info | warning | critical
    node: str = Field(
        default="", sa_column_kwargs={"server_default": text("''")}
    )  # the GPU's node ('' none named)
    gpu: int | None = None
    t: float  # the newest occurrence
    step: int | None = None
    message: str = Field(sa_column=Column(Text, nullable=False))
    suggestion: str | None = Field(default=None, sa_column=Column(Text))
    # The suggestion as train.yaml keys -> new values, JSON; NULL when it is not a key change.
    change: str | None = Field(default=None, sa_column=Column(Text))
    open: bool = True
    first_t: float
    last_t: float
    count: int = 1


class Alert(AlertBase, table=True):
    """One episode of a detected condition; open while it holds, updated while it recurs."""

    __tablename__ = "alerts"
    __table_args__ = (Index("ix_alerts_job_kind", "job_id", "kind", "gpu"), Index("ix_alerts_open", "open"))


class EstimateCalibration(SQLModel, table=True):
    """Predicted against measured peak of one finished job, so estimates can be calibrated per GPU kind."""

    __tablename__ = "estimate_calibrations"
    __table_args__ = (
        UniqueConstraint("job_id", name="uq_calibration_job"),
        Index("ix_calibration_kind", "gpu_kind"),
    )

    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE")
    gpu_kind: str  # the device name from the SMI, or "cpu"
    predicted_bytes: int = Field(sa_type=BigInteger)
    measured_bytes: int = Field(sa_type=BigInteger)
    source: str  # memory_samples | vram_reserved
    ratio: float  # measured / predicted
    created_at: datetime = Field(default_factory=utcnow)


class ChartTile(SQLModel, table=True):
    """One tile of a series' pyramid: count, and the min, max, first and last point (x, y, aux) of
    the points with floor(x / 4**level) == tile (services/charts/pyramid.py)."""

    __tablename__ = "chart_tiles"
    __table_args__ = {"sqlite_with_rowid": False}

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    series: str = Field(primary_key=True)  # metric.<name>, metric.rows, memory.<gpu>
    level: int = Field(primary_key=True)
    tile: int = Field(primary_key=True)
    n: int
    x_min: float
    y_min: float
    a_min: float
    x_max: float
    y_max: float
    a_max: float
    x_first: float
    y_first: float
    a_first: float
    x_last: float
    y_last: float
    a_last: float


class ChartState(SQLModel, table=True):
    """The highest row id of a raw table (memory, metrics) that the tiles hold."""

    __tablename__ = "chart_state"

    source: str = Field(primary_key=True)
    through_id: int


class ChartOpen(SQLModel, table=True):
    """A series' newest finest-level tile, not yet folded into the coarser levels (readers merge it in)."""

    __tablename__ = "chart_open"
    __table_args__ = {"sqlite_with_rowid": False}

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    series: str = Field(primary_key=True)
    tile: int


class ChartPruned(SQLModel, table=True):
    """A job whose raw memory samples retention dropped: its memory charts read tiles >= level only."""

    __tablename__ = "chart_pruned"

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    level: int


class AlertState(SQLModel, table=True):
    """A running job's detector state as the alert engine last saved it (alerts/snapshot.py), and the
    newest row of each series table it had been fed: after a restart the engine loads it and feeds
    only the rows after those, instead of every stored sample."""

    __tablename__ = "alert_states"

    job_id: int = Field(foreign_key="jobs.id", ondelete="CASCADE", primary_key=True)
    upto_memory: int
    upto_metrics: int
    upto_logs: int
    state: bytes = Field(sa_type=LargeBinary)
    saved_at: float


def core(model: type[SQLModel]) -> Table:
    """A table model's Core table, for bulk statements that skip the ORM."""
    return model.__table__  # type: ignore[attr-defined]  # SQLModel sets it on the class, undeclared
