"""The input of the alert engine: a job's series, as plain values (no database, no clock)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

GiB = 1024**3


@dataclass
class Point:
    t: float
    step: int | None
    loss: float | None = None
    eval_loss: float | None = None


@dataclass
class Series:
    memory: dict[int, list[tuple[float, int, int | None]]] = field(default_factory=dict)  # gpu -> (t, used, total)
    points: list[Point] = field(default_factory=list)
    logs: list[tuple[float, str]] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the train.yaml keys
    ds: dict[str, Any] | None = None  # ds_config.json
    gpu_names: dict[int, str] = field(default_factory=dict)
    devices: list[int] = field(default_factory=list)  # node indices of the job's GPUs, in local order
    running: bool = False
    now: float | None = None  # evaluation time; None: the end of the series


@dataclass
class Finding:
    kind: str
    severity: str  # info | warning | critical
    gpu: int | None
    times: list[float]  # every occurrence, oldest first
    step: int | None
    message: str
    suggestion: str | None
    open: bool

    @property
    def t(self) -> float:
        return self.times[-1]

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "severity": self.severity, "gpu": self.gpu, "t": self.t, "step": self.step,
                "message": self.message, "suggestion": self.suggestion}


@dataclass
class Limits:
    near_oom_share: float = 0.95
    stall_min_s: float = 120.0
    hold_s: float = 300.0


def gib(b: float) -> str:
    return f"{b / GiB:.1f} GiB" if b >= GiB / 10 else f"{b / 1024**2:.0f} MiB"
