"""What routes answer, as the OpenAPI schema declares it: every error status, the helper routes' shapes."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


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


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
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
