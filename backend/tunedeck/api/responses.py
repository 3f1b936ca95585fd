"""What routes answer, as the OpenAPI schema declares it: every error status, the helper routes' shapes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

# A route's `responses=`: OpenAPI entries by status code.
Responses = dict[int | str, dict[str, Any]]


class Message(BaseModel):
    """An error that is not about one field: what went wrong, in words."""

    detail: str


WHY = {
    401: "no token, or an invalid or revoked one",
    403: "the token's role (or ownership) does not allow this",
    404: "no such job (or preset, or node)",
    409: "the job has already ended",
    413: "the request body is larger than TUNEDECK_MAX_BODY_BYTES",
    503: "storage unavailable (read-only workspace or database)",
    507: "storage full",
}


# The body limit answers before any route runs, in plain text.
TOO_LARGE = {"description": WHY[413], "content": {"text/plain": {"schema": {"type": "string"}}}}


def errors(*codes: int) -> Responses:
    """`responses=` entries for these statuses, each answered as {"detail": "..."} (413: plain text)."""
    return {
        code: TOO_LARGE if code == 413 else {"model": Message, "description": WHY[code]} for code in codes
    }


# Every /api route: the token guard and the storage errors any database access can meet.
COMMON = errors(401, 403, 503, 507)


# ---------------------------------------------------------------- answers of the helper routes


class Finding(BaseModel):
    code: str
    severity: Literal["error", "warning", "info"]
    path: str
    message: str
    fix: str


class LintOut(BaseModel):
    findings: list[Finding]


class Preset(BaseModel):
    name: str
    kind: str = Field(description="yaml (a job config) or json (a DeepSpeed config)")


class PresetText(Preset):
    text: str


class CursorOut(BaseModel):
    cursor: str


class Stored(BaseModel):
    stored: int = Field(description="the batch's seq")


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


class Health(BaseModel):
    status: Literal["ok"]
    version: str
    executor: str
    gpus: int = Field(description="GPUs the scheduler hands out on this node")
    cpu_slots: int
    near_oom_share: float = Field(
        description="share of a device's memory that, sustained, raises vram_near_oom (the charts' band)"
    )


class Nonfinite(BaseModel):
    """Where a metric was inf or NaN (its curve skips them), thinned to `max_points`."""

    step: list[int]
    t: list[float]
    value: list[str] = Field(description="what the trainer logged: inf, -inf or nan")


class Curve(BaseModel):
    step: list[int]
    t: list[float]
    y: list[float]
    n: int = Field(description="finite points in the window before downsampling")
    nonfinite_points: Nonfinite


class SeriesOut(BaseModel):
    count: int = Field(description="metric rows in the window")
    last_id: int | None = Field(description="the newest metric row's id (a stream cursor's m)")
    downsampled: bool
    series: dict[str, Curve] = Field(description="one curve per metric (loss, eval_loss, lr, ...)")


class Estimate(BaseModel):
    per_gpu_bytes: int
    breakdown: dict[str, int] = Field(description="bytes per part (weights, gradients, optimizer, ...)")
    device_total_bytes: int | None
    fits: bool | None = Field(description="None when the device's memory is unknown")
    warnings: list[str]
    params: int
    trainable_params: int
    method: str
    zero_stage: int | None
    gpus: int
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
    ratio: float | None = Field(description="measured / predicted per-GPU peak")


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
    devices: list[dict[str, Any]] = Field(description="the training torch's devices as its probe saw them")
    packages: dict[str, str | bool | None] = Field(description="installed versions; flash_attn: importable")
    checks: list[Check]
    checked_at: float


class NodeGpu(BaseModel):
    index: int
    name: str | None
    bus_id: str | None
    total_bytes: int | None
    used_bytes: int
    util: float | None
    job_id: int | None = Field(description="the running job holding this GPU")


class Node(BaseModel):
    name: str
    backend: str
    reason: str | None = Field(description="why GPU backends are absent")
    gpus: list[NodeGpu]
    id: str | None = Field(None, description="the Ray node id (executor `ray`); null on the local executor")
    address: str | None = Field(None, description="the node's IP (executor `ray`)")
    alive: bool = Field(True, description="false: Ray lost the node (its GPUs are not read)")
    head: bool = Field(False, description="the Ray head node")
    gpu_slots: int | None = Field(None, description="GPUs the node offers Ray (logical; executor `ray`)")
