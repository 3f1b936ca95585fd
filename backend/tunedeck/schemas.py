"""What the REST API takes and answers (pydantic): the job spec, rows and pages of rows, alerts, the
helper routes' answers, the error body. Every API shape is here; api/answers.py says which error
statuses a route declares, and what runners send is in contract/protocol.py.

A row's answer derives from the base that its table derives from too (store/tables.py: `AlertBase`
-> `Alert` and `AlertOut`), so a field is declared once. An answer overrides only what it answers
otherwise (JSON text stored, an object answered; an id the answer always has) and adds what it computes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, BeforeValidator, ValidationInfo, field_validator
from pydantic import Field as PField
from sqlmodel.main import SQLModelConfig

from tunedeck import tree
from tunedeck.alerts import Severity
from tunedeck.config import SLURM_CONSTRAINT, SLURM_NAME, SLURM_TIME
from tunedeck.contract import runfiles
from tunedeck.contract.lflog import METRICS
from tunedeck.contract.protocol import Strict
from tunedeck.planning.queueplan import Spot, asked
from tunedeck.store.tables import (
    AlertBase,
    Job,
    JobBase,
    JobProgress,
    JobStatus,
    LogBase,
    MemoryBase,
    MetricBase,
    PresetBase,
)

_Row = TypeVar("_Row", bound="JobOut")  # JobOut or JobCreated: `of` and `placed` keep the class
MAX_YAML_BYTES = 1_000_000  # a job YAML as the YAML submit and a team preset take it
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


class SlurmSpec(Strict):
    """Where and how a job runs on Slurm (executor `slurm`); each field unset takes the server's setting."""

    partition: str | None = PField(None, pattern=SLURM_NAME, description="`--partition`")
    account: str | None = PField(None, pattern=SLURM_NAME, description="`--account`")
    qos: str | None = PField(None, pattern=SLURM_NAME, description="`--qos`")
    time: str | None = PField(
        None, pattern=SLURM_TIME, description="`--time`: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
    )
    constraint: str | None = PField(
        None, pattern=SLURM_CONSTRAINT, description="`--constraint`: node features (`mi250&ib`, `a|b`)"
    )


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
    slurm: SlurmSpec | None = PField(
        None, description="partition, account, QOS, time limit and constraint on Slurm (executor `slurm`)"
    )
    env: dict[str, str] = PField(
        default_factory=dict,
        description="environment variables for the trainer, from an allow-list (NCCL_*, RCCL_*, HSA_*, "
        "ROCR_*, HIP_*, PYTORCH_CUDA_ALLOC_CONF, PYTORCH_HIP_ALLOC_CONF, OMP_NUM_THREADS)",
    )
    parent_id: int | None = PField(
        None,
        ge=1,
        le=2**62,
        description="the job this one was made from (the job page's Edit as new…, an export of its "
        "adapter): it must exist; the new job's `parent_id`, its lineage",
    )

    @field_validator("config", "deepspeed")
    @classmethod
    def _plain_text(cls, v: Any, info: ValidationInfo) -> Any:
        if bad := tree.problems(v, [info.field_name]):
            raise ValueError("; ".join(reason for _, reason in bad[:5]))
        return v


# ---------------------------------------------------------------- rows, as answered


def answered(*names: str) -> SQLModelConfig:
    """An answer's config whose schema requires `names`, with no default shown: fields that the row's
    base gives a default (for a new row) and that every answer has. The schema keeps requiring what it
    required when each answer declared its own fields."""

    def required(schema: dict[str, Any]) -> None:
        for name in names:
            schema["properties"][name].pop("default", None)
        have = {*names, *schema.get("required", ())}
        schema["required"] = [name for name in schema["properties"] if name in have]

    return SQLModelConfig(json_schema_extra=required)


def _json(v: Any) -> Any:
    """A JSON column's text as the value it holds (the ORM's rows and plain SELECTs give the text)."""
    return json.loads(v) if isinstance(v, str) else v


def _devices(v: Any) -> Any:
    """The row's comma-separated device indices as a list."""
    if not isinstance(v, str):
        return v
    return [int(d) for d in v.split(",")] if v else None


def _tags(v: Any) -> Any:
    """The row's JSON list of tags; none (NULL or no text): an empty list."""
    return _json(v) if v else []


FromJson = BeforeValidator(_json)


# The row's progress columns, one object of a job's answer (no docstring: the schema has no description).
class Progress(JobProgress):
    pass


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


class JobOut(JobBase):
    model_config = answered(
        "owner",
        "status",
        "gpus",
        "exit_code",
        "error",
        "created_at",
        "started_at",
        "finished_at",
        "run_dir",
        "output_dir",
    )

    id: int
    devices: Annotated[list[int] | None, BeforeValidator(_devices)]  # type: ignore[assignment]  # stored as text, answered as the value
    tags: Annotated[list[str], BeforeValidator(_tags)] = []  # type: ignore[assignment]  # stored as text, answered as the value
    progress: Progress
    stopped: str | None = PField(
        None,
        description='a stopped job\'s "stopped by NAME at step N, adapter saved" (or "no adapter saved")',
    )
    alerts: AlertSummary = AlertSummary()
    verdict: str = PField(
        description="the status, or succeeded_with_problems for a success whose loss went NaN, "
        "diverged or stayed stuck (alerts.problems)"
    )
    priority: int = 0
    pinned: list[int] | None = PField(
        None, description="the GPU ids its spec pins (`devices`): it starts only on them"
    )
    queue_position: int | None = PField(None, description="a queued job's place in line: 1 starts next")
    waiting_for: str | None = PField(None, description="why a queued job has not started, in words")

    @classmethod
    def of(cls: type[_Row], job: Job, alerts: AlertSummary | None = None) -> _Row:
        """The row's fields as they are (devices and tags parsed), and what the answer computes."""
        alerts = alerts or AlertSummary()
        troubled = job.status == JobStatus.succeeded and alerts.problems
        computed = {
            "progress": Progress.model_validate(job, from_attributes=True),
            "stopped": stop_message(job),
            "alerts": alerts,
            "verdict": "succeeded_with_problems" if troubled else job.status.value,
            "priority": (want := asked(job)).priority,
            "pinned": list(want.devices) if want.devices else None,
        }
        return cls.model_validate(job, from_attributes=True, update=computed)

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


class MetricOut(MetricBase):
    # Every logged column is required in the answer (null when not logged), but grad_norm, which
    # older answers did not have.
    model_config = answered("step", *(m for m in METRICS if m != "grad_norm"))

    id: int
    nonfinite: Annotated[dict[str, NonFinite] | None, FromJson] = PField(  # type: ignore[assignment]  # stored as text, answered as the value
        None, description='the keys above that are null because the value was not finite: {"loss": "inf"}'
    )
    extra: Annotated[dict[str, float] | None, FromJson] = PField(  # type: ignore[assignment]  # stored as text, answered as the value
        None, description="the step's other numbers as the Trainer logged them (eval_runtime, rewards, ...)"
    )


class MetricPage(BaseModel):
    points: list[MetricOut]
    next: int | None


class LogOut(LogBase):
    id: int


class LogPage(BaseModel):
    lines: list[LogOut]
    next: int | None


class DatasetOut(BaseModel):
    name: str = PField(description="the name a job's `dataset` gives")
    dataset_dir: str = PField(description="the folder whose dataset_info.json defines it")
    formatting: str = PField(description="alpaca or sharegpt, as its entry says")
    file: str | None
    size_bytes: int | None
    rows: int | None = PField(description="rows of a .json or .jsonl file (null: not counted)")
    problem: str | None = PField(description="why its file is not measured, where it is not")


class DatasetList(BaseModel):
    datasets: list[DatasetOut]


class DatasetAdded(BaseModel):
    """A dataset just registered: where its entry is, and what its file was found to hold."""

    name: str
    dataset_dir: str = PField(description="the folder whose dataset_info.json now defines it")
    file: str
    size_bytes: int
    rows: int
    formatting: str = PField(description="alpaca or sharegpt, as detected")
    columns: dict[str, str] = PField(
        description="the entry's column mapping (LLaMA-Factory's names → the file's)"
    )
    tags: dict[str, str] = PField(description="sharegpt: the role and content tags of a turn")
    detected: str = PField(description="what was detected, in one sentence")
    entry: dict[str, Any] = PField(description="the dataset_info.json entry as written")


class PreviewRow(BaseModel):
    row: int
    text: str | None = PField(None, description="the row as the model sees it: the chat template applied")
    tokens: int | None = None
    response_tokens: int | None = PField(None, description="tokens of the answer turns (the ones trained on)")
    over_cutoff: bool | None = PField(None, description="longer than cutoff_len: LLaMA-Factory cuts it")
    error: str | None = None


class DatasetRendered(BaseModel):
    name: str
    file: str
    model: str
    template: str
    cutoff_len: int
    formatting: str
    rows: list[PreviewRow]


class ModelOut(BaseModel):
    path: str
    name: str
    source: str = PField(description="roots: a folder inside the allowed roots; hf_cache: the HF cache")
    hub_id: str | None
    model_type: str | None
    architecture: str | None
    dtype: str | None
    parameters: int | None = PField(description="from the safetensors headers (null: not safetensors)")
    templates: list[str] = PField(description="LLaMA-Factory's templates for its family, best first")
    problem: str | None


class ModelList(BaseModel):
    models: list[ModelOut]


class CompareLast(BaseModel):
    """Where a job ended: each column's last logged value (null: never logged)."""

    step: int | None
    loss: float | None
    eval_loss: float | None = PField(description="the last evaluation's loss (eval lines log no loss)")
    grad_norm: float | None
    throughput: float | None = PField(description="tokens/s")


class CompareJob(BaseModel):
    id: int
    name: str
    status: JobStatus
    last: CompareLast


class CompareOut(BaseModel):
    jobs: list[CompareJob] = PField(description="in the order asked")
    differ: dict[str, dict[str, Any]] = PField(
        description="train.yaml keys whose values differ (output_dir aside): key, then job id, then the "
        "whole value (null: the job does not set it)"
    )


class JobConfigOut(BaseModel):
    train_yaml: str
    ds_config: str | None
    run_dir: str
    output_dir: str
    env: dict[str, str] = PField({}, description="the job's own environment variables (spec `env`)")
    batch_script: str | None = PField(
        None, description="the Slurm batch script the job was submitted with (executor `slurm`)"
    )


class FileOut(BaseModel):
    path: str = PField(description="relative to the job's output folder")
    bytes: int


class MemorySampleOut(MemoryBase):
    model_config = answered("total_bytes", "util", "power_w", "temp_c")

    id: int


class MemoryGpu(BaseModel):
    node: str = ""
    gpu: int
    name: str | None
    total_bytes: int | None
    serial: str | None = PField(None, description="board serial, from the device's first sample")
    uuid: str | None = PField(None, description="the SMI's UUID, from the device's first sample")
    partition: str | None = PField(None, description="compute/memory partition mode, e.g. CPX/NPS4")
    power_shared_with: int | None = PField(
        None, description="the GPU whose power reading covers this one (an MI250X's secondary GCD): no sum"
    )


class MemoryPage(BaseModel):
    samples: list[MemorySampleOut]
    next: int | None
    downsampled: bool
    gpus: list[MemoryGpu]


class AlertOut(AlertBase):
    model_config = answered("gpu", "step", "suggestion", "open", "count")

    id: int
    change: Annotated[dict[str, Any] | None, FromJson] = PField(  # type: ignore[assignment]  # stored as text, answered as the value
        None, description="the suggestion as train.yaml keys and new values (null: not a key change)"
    )


# ---------------------------------------------------------------- answers of the helper routes, errors


class Message(BaseModel):
    """An error that is not about one field: what went wrong, in words."""

    detail: str


class Finding(BaseModel):
    code: str
    severity: Literal["error", "warning", "info"]
    path: str
    message: str
    fix: str


class LintOut(BaseModel):
    findings: list[Finding]


class Preset(PresetBase):
    """A preset as listed: shipped with tunedeck (configs/, read-only) or saved by the team."""

    model_config = answered("owner", "description")

    kind: str = PField(description="yaml (a job config) or json (a DeepSpeed config)")
    source: Literal["shipped", "team"] = PField(
        description="shipped: a file of the package (read-only); team: saved with POST /api/presets"
    )
    created_at: datetime | None = PField(  # type: ignore[assignment]  # a shipped file has no save time
        None, description="when the team saved it (none for shipped ones)"
    )


class PresetText(Preset):
    text: str


class PresetIn(Strict):
    """A team preset: a job YAML checked exactly as `POST /api/jobs/yaml` checks one."""

    name: str = PField(**NAME_RULES)
    description: str = PField("", max_length=500)
    text: str = PField(min_length=1, max_length=MAX_YAML_BYTES, description="the job's LLaMA-Factory YAML")


class CursorOut(BaseModel):
    cursor: str


class Stored(BaseModel):
    stored: int = PField(description="the batch's seq")
    stacks: int | None = PField(
        None, description="the newest stack-dump request for the job: a runner that has not sent it does"
    )


class ParsedYaml(BaseModel):
    config: dict[str, Any]
    deepspeed: Any = None


class PreviewOut(BaseModel):
    train_yaml: str
    ds_config: str | None
    gpus: int
    warnings: list[str]


class Calibration(BaseModel):
    gpu_kind: str
    jobs: int
    mean_ratio: float
    min_ratio: float
    max_ratio: float


class IntegrityOut(BaseModel):
    state: str = PField(description="pending, running, ok, damaged, or why the check could not run")
    checked_at: float | None = PField(None, description="when the last full check ended (Unix time)")
    took_s: float | None = PField(None, description="how long it read the file")


class WalCheckpointOut(BaseModel):
    at: float = PField(description="when it ran (Unix time)")
    busy: bool = PField(description="readers or a writer held on past its wait: the WAL was not emptied")
    wal_bytes_before: int
    wal_bytes_after: int
    frames: int = PField(description="frames in the WAL when it ran (SQLite's count; -1 when busy)")
    copied: int = PField(description="frames copied into the database")
    took_s: float


class DayOut(BaseModel):
    memory_samples: int = PField(description="memory samples that arrived in the 24 h before the survey")
    metric_points: int = PField(description="trainer_log lines that arrived in those 24 h")
    bytes_per_sample: float = PField(description="one stored sample with its index and chart tiles")
    bytes_per_point: float = PField(description="one stored trainer_log line with its indexes")
    bytes: int = PField(description="what those 24 h take on disk")
    surveyed_at: float = PField(description="when the file's pages were counted (Unix time)")


class StorageOut(BaseModel):
    db_bytes: int = PField(description="the database file's pages")
    free_bytes: int = PField(description="pages inside it that are free (retention's deletes)")
    wal_bytes: int = PField(description="the WAL file beside it")
    wal_limit_bytes: int = PField(description="past this the WAL is checkpointed and emptied")
    checkpoints: int = PField(description="checkpoints this server asked for")
    last_checkpoint: WalCheckpointOut | None = None
    incremental_vacuum: bool = PField(
        description="free pages are given back to the disk (new databases; `tunedeck db vacuum` converts an "
        "older one)"
    )
    given_back_bytes: int = PField(description="bytes given back to the disk since the start")
    day: DayOut | None = PField(None, description="what a day of telemetry costs on disk (the last survey)")


class Health(BaseModel):
    status: Literal["ok", "degraded"]
    reason: str | None = PField(
        None, description="why it is degraded: a full disk, a read-only workspace or a damaged database"
    )
    version: str
    executor: str
    gpus: int = PField(description="GPUs the scheduler hands out on this node")
    cpu_slots: int
    near_oom_share: float = PField(
        description="share of a device's memory that, sustained, raises vram_near_oom (the charts' band)"
    )
    chat_idle_s: float = PField(
        description="a chat job with no completion for this long is stopped (TUNEDECK_CHAT_IDLE_S); until "
        "then it holds its GPUs or a CPU slot"
    )
    integrity: IntegrityOut | None = PField(
        None,
        description="the database's full check beside the serving server (TUNEDECK_INTEGRITY_CHECK="
        "background); none where it ran before the start",
    )
    storage: StorageOut | None = PField(None, description="the database file's sizes, WAL and a day's cost")


class ActsOn(BaseModel):
    """Which jobs the caller may act on (cancel, tag, delete, chat with), by whose they are."""

    own: bool = PField(description="jobs the caller's token made")
    unowned: bool = PField(description="jobs made without a token")
    others: bool = PField(description="jobs another token made")


class Me(BaseModel):
    name: str | None = PField(description="the token's name; null without a token")
    role: Literal["viewer", "submitter", "admin"] | None = None
    open_read: bool = PField(description="reading needs no token here")
    open_write: bool = PField(description="writing needs no token here (open mode)")
    may_submit: bool = PField(description="may launch jobs (submit, clone, resume)")
    acts_on: ActsOn


class Nonfinite(BaseModel):
    """Where a metric was inf or NaN (its curve skips them), thinned to `max_points`."""

    step: list[int]
    t: list[float]
    value: list[str] = PField(description="what the trainer logged: inf, -inf or nan")


class Curve(BaseModel):
    step: list[int]
    t: list[float]
    y: list[float]
    n: int = PField(description="finite points in the window before downsampling")
    nonfinite_points: Nonfinite
    job: list[int] | None = PField(None, description="with `lineage`: the job (attempt) each point is from")


class Attempt(BaseModel):
    job_id: int
    name: str
    resumed_at: int | None = PField(
        description="the step of the checkpoint it resumed from (null: the first)"
    )
    first_step: int | None = PField(description="its first step in the answer")
    last_step: int | None = PField(description="its last step in the answer (later ones were done again)")


class SeriesOut(BaseModel):
    count: int = PField(description="metric rows in the window")
    last_id: int | None = PField(description="the newest metric row's id (a stream cursor's m)")
    downsampled: bool
    series: dict[str, Curve] = PField(description="one curve per metric (loss, eval_loss, lr, ...)")
    lineage: list[Attempt] | None = PField(
        None, description="with `lineage`: the runs this one resumed and itself, oldest first"
    )


class Estimate(BaseModel):
    per_gpu_bytes: int
    breakdown: dict[str, int] = PField(description="bytes per part (weights, gradients, optimizer, ...)")
    device_total_bytes: int | None
    fits: bool | None = PField(description="None when the device's memory is unknown")
    warnings: list[str]
    params: int
    trainable_params: int
    method: str
    zero_stage: int | None
    gpus: int = PField(description="GPUs per node, as the spec gives them (0: a CPU run)")
    nodes: int = PField(1, description="nodes, each with `gpus` GPUs")
    ranks: int | None = PField(
        None,
        description="the ranks ZeRO shards over: nodes × GPUs (one a node on the CPU); none in older estimates",
    )
    dtype_bytes: int
    gradient_checkpointing: bool
    tokens_per_micro_batch: int


class Measured(BaseModel):
    bytes: int
    source: Literal["memory_samples", "vram_reserved"]
    gpu_kind: str


class JobEstimate(BaseModel):
    job_id: int
    estimate: Estimate | None
    measured: Measured | None
    ratio: float | None = PField(description="measured / predicted per-GPU peak")


class Check(BaseModel):
    name: str
    status: Literal["ok", "warn", "fail", "skip"]
    detail: str
    fix: str | None


class Preflight(BaseModel):
    ok: bool
    summary: str
    backend: Literal["rocm", "cuda", "cpu"] | None
    hostname: str | None
    python: str | None
    devices: list[dict[str, Any]] = PField(description="the training torch's devices as its probe saw them")
    packages: dict[str, str | bool | None] = PField(description="installed versions; flash_attn: importable")
    checks: list[Check]
    checked_at: float


class GpuProcess(BaseModel):
    pid: int
    name: str | None = PField(None, description="the process name, where the SMI or the host tells")
    vram_bytes: int | None = PField(None, description="the VRAM it holds, where the SMI tells")
    job_id: int | None = PField(None, description="the tunedeck job whose trainer it is, when known")


class NodeGpu(BaseModel):
    index: int
    name: str | None
    bus_id: str | None
    total_bytes: int | None
    used_bytes: int
    util: float | None
    job_id: int | None = PField(description="the running job holding this GPU")
    power_w: float | None = None
    power_shared_with: int | None = PField(
        None, description="the GPU whose power reading covers this one (an MI250X's secondary GCD)"
    )
    temp_c: float | None = PField(None, description="edge sensor (MI300-series parts have none)")
    temp_junction_c: float | None = None
    temp_hbm_c: float | None = None
    clock_mhz: float | None = None
    ecc_correctable: int | None = None
    ecc_uncorrectable: int | None = None
    ecc_blocks: dict[str, list[int]] = PField(
        default_factory=dict, description="block -> [correctable, uncorrectable], blocks with errors only"
    )
    throttle: dict[str, float] = PField(
        default_factory=dict,
        description="share of time (0..1) held by power / thermal / hbm_thermal limits since the last reading",
    )
    throttle_reasons: list[str] = PField(default_factory=list, description="what holds the clocks down now")
    xgmi_read_bytes: int | None = PField(
        None, description="bytes read over the GPU's xGMI links since the driver loaded (AMD MI300 series)"
    )
    xgmi_write_bytes: int | None = PField(None, description="bytes written over its xGMI links, cumulative")
    xgmi_read_bytes_per_s: float | None = PField(
        None,
        description="xGMI read rate between the last two readings (null: unknown, or a counter went back)",
    )
    xgmi_write_bytes_per_s: float | None = PField(
        None, description="xGMI write rate between the last two readings"
    )
    partition: str | None = None
    serial: str | None = None
    uuid: str | None = None
    processes: list[GpuProcess] = PField(default_factory=list, description="who is on this GPU")


class Node(BaseModel):
    name: str
    backend: str
    reason: str | None = PField(description="why GPU backends are absent (the libraries' own words)")
    summary: str | None = PField(
        None, description="why this node shows no GPUs, in a sentence (the page's; null: see `reason`)"
    )
    gpus: list[NodeGpu]
    id: str | None = PField(None, description="the Ray node id (executor `ray`); null on the local executor")
    address: str | None = PField(None, description="the node's IP (executor `ray`)")
    alive: bool = PField(True, description="false: Ray lost the node (its GPUs are not read)")
    head: bool = PField(False, description="the Ray head node")
    gpu_slots: int | None = PField(
        None,
        description="GPUs the node offers Ray (logical; executor `ray`) or Slurm (its GRES; executor `slurm`)",
    )
    state: str | None = PField(
        None, description="Slurm's state of the node (IDLE, MIXED, DOWN+DRAIN, ...; executor `slurm`)"
    )
    jobs: list[int] = PField(
        [], description="the running tunedeck jobs placed on the node (executor `slurm`)"
    )


# Stack dumps of a job's trainer processes (api/stacks.py)
class StacksAsked(BaseModel):
    request: int = PField(
        description="the request's number; its dumps arrive as each node's runner sends them"
    )


class RankPlace(BaseModel):
    rank: int
    node: str
    pid: int
    where: str = PField(description="where the rank's main thread waits: a collective, data loading, ...")


class StacksOut(BaseModel):
    request: int
    asked_at: float = PField(description="Unix time of the request")
    reason: str
    summary: str | None = PField(description="'ranks 0–2 in all_reduce (backward), rank 3 in data loading'")
    flight_recorder: str | None = PField(
        None,
        description="what the ranks' flight recorders say (the job's env turns it on): 'rank 0 in all_gather "
        "#2, not completed; rank 1 never entered #2 (completed #1)'",
    )
    ranks: list[RankPlace]
    nodes: list[dict[str, Any]] = PField(description="each node's report: every process dumped, its threads")


# ---------------------------------------------------------------- the routes' own bodies, queries, answers


# The form's choices and help (api/forms.py)
class KeyHelp(BaseModel):
    help: str
    type: str | None
    default: Any = None
    choices: list[Any] | None = None


class HelpOut(BaseModel):
    llamafactory_version: str | None
    keys: dict[str, KeyHelp]


class TemplatesOut(BaseModel):
    llamafactory_version: str | None
    templates: list[str]


class DatasetsOut(BaseModel):
    dataset_dir: str
    datasets: list[str]


class DatasetPreview(BaseModel):
    name: str
    file: str
    formatting: str
    columns: dict[str, Any] | None
    rows: list[Any]


class ModelTemplates(BaseModel):
    model_type: str | None
    templates: list[str]


# A job's lifecycle: checkpoints, resume, clone, tags and notes, delete (api/lifecycle.py)
Tag = Annotated[str, PField(min_length=1, max_length=50, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:+-]*$")]


class CheckpointOut(BaseModel):
    name: str
    step: int
    mtime: datetime
    bytes: int
    holds: list[str] = PField(
        description="adapter, model, optimizer, scheduler, rng, trainer_state, zero_shards"
    )
    zero_shards: int
    resumable: bool = PField(description="weights, optimizer state and trainer state are all there")


class ResumeIn(Strict):
    checkpoint: str | None = PField(
        None,
        pattern=r"^checkpoint-\d{1,12}$",
        description="a checkpoint of the job; default the newest resumable",
    )


class CloneIn(Strict):
    overrides: dict[str, Any] = PField(
        default_factory=dict, description="train.yaml keys to set (null drops a key); `deepspeed` too"
    )
    name: str | None = PField(None, **NAME_RULES)
    env: dict[str, str | None] | None = PField(
        None,
        description="environment variables to set for the trainer (null drops one); same allow-list as a submit",
    )
    priority: int | None = PField(None, description="the new job's priority (default: the parent's)")
    devices: list[int] | None = PField(None, description="specific GPU ids (default: the parent's)")
    gpus: int | None = PField(None, description="GPUs (default: the parent's)")


class JobPatch(Strict):
    tags: list[Tag] | None = PField(None, max_length=20, description="the job's whole tag list")
    notes: str | None = PField(None, max_length=10000)
    priority: int | None = PField(
        None, ge=0, le=10, description="a queued job's new priority (409 once it has started)"
    )


class Deleted(BaseModel):
    id: int
    files: Literal["keep", "remove"]


# Results of eval, predict and export jobs (api/results.py)
MAX_PREDICTION_ROWS = 200  # a page of generated predictions at most


class ResultRow(BaseModel):
    split: str = PField(description="train, eval or predict: the results file it comes from")
    name: str = PField(description="the metric without its split prefix: loss, bleu-4, rouge-l, runtime, ...")
    value: float


class ExportOut(BaseModel):
    files: list[FileOut]
    total_bytes: int
    weights_bytes: int = PField(description="the merged model's weight files")
    base_weights_bytes: int | None = PField(description="the base model's weight files, when a local folder")
    adapter_weights_bytes: int | None


class ResultsOut(BaseModel):
    job_id: int
    kind: str
    metrics: list[ResultRow]
    predictions: int = PField(description="rows in generated_predictions.jsonl")
    export: ExportOut | None


class PredictionRow(BaseModel):
    index: int
    prompt: str
    label: str
    prediction: str


class PredictionPage(BaseModel):
    rows: list[PredictionRow]
    offset: int
    total: int


class PageQuery(Strict):  # Strict: an unknown parameter is refused, not ignored
    offset: int = PField(0, ge=0, le=2**31)
    limit: int = PField(50, ge=1, le=MAX_PREDICTION_ROWS)


# Starting a chat job on a finished job (api/chat.py)
class ChatStart(Strict):
    gpus: int | None = PField(None, ge=0, le=64, description="GPUs for the chat server; 0 = CPU")
    max_new_tokens: int | None = PField(None, ge=1, le=1_000_000)
    temperature: float | None = PField(None, ge=0, le=100, allow_inf_nan=False)
    do_sample: bool | None = PField(
        None, description="false: greedy answers (requests may still ask otherwise)"
    )


# The team-wide alert list's query (api/alerts.py)
class TeamFilter(Strict):
    """The team-wide list's filters; an unknown one is refused (a typo must not widen the list)."""

    open: bool | None = None
    after: int | None = PField(None, ge=0, le=2**62, description="an alert id: only alerts after it")
    min_severity: Severity | None = PField(None, description="only alerts this severe or worse")
    order: Literal["asc", "desc"] = PField("asc", description="by id: oldest (asc) or newest (desc) first")
    limit: int = PField(1000, ge=1, le=1000)


# A VRAM estimate's body: a job spec and, optionally, the device to fit (api/checks.py)
class EstimateRequest(JobSpec):
    device_total_bytes: int | None = PField(
        None, gt=0, description="memory of one device; default: this node's smallest GPU (none on a CPU node)"
    )
