"""The input of the alert engine: a job's series, as plain values (no database, no clock)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

GiB = 1024**3
KEEP = 512  # occurrences of a condition kept with their times; older ones are only counted


@dataclass
class Point:
    t: float
    step: int | None
    loss: float | None = None
    eval_loss: float | None = None
    throughput: float | None = None  # tokens/s (the hardware detectors judge a drop of it)
    grad_norm: float | None = None  # tunedeck_log.jsonl's, of the same logging event
    lr: float | None = None  # the learning rate the scheduler gave at this step (trainer_log's `lr`)


@dataclass
class Series:
    memory: dict[int | tuple[str, int], list[tuple[float, int, int | None]]] = field(
        default_factory=dict
    )  # gpu, or (node, gpu) on a job of several nodes -> (t, used, total)
    points: list[Point] = field(default_factory=list)
    logs: list[tuple[float, str]] = field(default_factory=list)
    # gpu or (node, gpu) -> (times, {column: values}): the hardware readings (alerts.hardware.COLUMNS)
    hardware: dict[int | tuple[str, int], tuple[list[float], dict[str, list]]] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)  # the train.yaml keys
    ds: dict[str, Any] | None = None  # ds_config.json
    gpu_names: dict[int, str] = field(default_factory=dict)
    vocab_size: int | None = None  # the model's (config.json), where the server could read it
    devices: list[int] = field(default_factory=list)  # node indices of the job's GPUs, in local order
    running: bool = False
    now: float | None = None  # evaluation time; None: the end of the series


@dataclass
class Finding:
    kind: str
    severity: str  # info | warning | critical
    gpu: int | None
    times: list[float]  # the occurrences, oldest first (the KEEP most recent of `count`)
    step: int | None
    message: str
    suggestion: str | None
    open: bool
    count: int = 0  # every occurrence, when `times` holds only the most recent (0: len(times))
    first: float | None = None  # the first occurrence, when `times` no longer holds it
    change: dict[str, Any] | None = None  # the suggestion as train.yaml keys -> new values, if it is one
    node: str = ""  # the node of `gpu` ('' when the job's samples name none)

    def __post_init__(self) -> None:
        self.count = self.count or len(self.times)
        self.first = self.times[0] if self.first is None else self.first

    @property
    def t(self) -> float:
        return self.times[-1]

    @property
    def complete(self) -> bool:
        """Whether `times` holds every occurrence."""
        return self.count == len(self.times)

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            **({"node": self.node} if self.node else {}),  # named only where samples name nodes
            "gpu": self.gpu,
            "t": self.t,
            "step": self.step,
            "message": self.message,
            "suggestion": self.suggestion,
            "change": self.change,
        }


class Occurrences:
    """The times a condition was seen, in order: how many, the first, and the KEEP most recent."""

    __slots__ = ("first", "n", "recent")

    def __init__(self) -> None:
        self.n = 0
        self.first: float | None = None
        self.recent: deque[float] = deque(maxlen=KEEP)

    def add(self, t: float) -> None:
        if not self.n:
            self.first = t
        self.n += 1
        self.recent.append(t)

    def extend(self, ts: list[float]) -> None:
        if ts:
            self.first = ts[0] if not self.n else self.first
            self.n += len(ts)
            self.recent.extend(ts[-KEEP:])

    def times(self) -> list[float]:
        return list(self.recent)

    def __len__(self) -> int:
        return self.n


@dataclass
class Limits:
    near_oom_share: float = 0.95
    stall_min_s: float = 120.0
    hold_s: float = 300.0


class Judging(NamedTuple):
    """What a detector's findings are judged on: the job (its config), where training stood when, the
    limits, the time, and whether the job still runs."""

    s: Series
    steps: Steps
    lim: Limits
    now: float
    running: bool


def device(gpu: int | None) -> str:
    """How a finding names its device: a CPU job's series (-1) is the host's memory, not a GPU."""
    return "host memory" if gpu == -1 else f"GPU {gpu}"


def median(x: Any) -> float:
    """np.median of a flat sequence, as a float and to the bit (a float array's own dtype, others as
    float64; NaN when empty or when any value is NaN), without np.median's general machinery: the
    findings take several medians of a few dozen values per device at every judgement, and there
    that machinery cost several times the sort itself."""
    a = np.asarray(x)
    if a.dtype.kind != "f":
        a = a.astype(np.float64)
    a = np.sort(a, axis=None)
    n = a.size
    if not n or math.isnan(a[-1]):  # (a sort puts NaN last)
        return math.nan
    m = n // 2
    return float(a[m]) if n % 2 else float((a[m - 1] + a[m]) / 2)


def gib(b: float) -> str:
    return f"{b / GiB:.1f} GiB" if b >= GiB / 10 else f"{b / 1024**2:.0f} MiB"


STEPS = 4096  # points kept to place a time in training (hours of a run at one point every few seconds)


class Steps:
    """(t, step) of the most recent points that carry a step: where in training a time falls."""

    def __init__(self) -> None:
        self.t: deque[float] = deque(maxlen=STEPS)
        self.step: deque[int] = deque(maxlen=STEPS)
        self._arrays: tuple[np.ndarray, np.ndarray] | None = None

    def add(self, t: float, step: int) -> None:
        self.t.append(t)
        self.step.append(step)
        self._arrays = None

    def at(self, times: list[float]) -> list[float] | None:
        """The step at each time, interpolated; None with fewer than two points."""
        if len(self.t) < 2:
            return None
        if self._arrays is None:
            self._arrays = (
                np.fromiter(self.t, np.float64, len(self.t)),
                np.fromiter(self.step, np.float64, len(self.t)),
            )
        return np.interp(times, *self._arrays).tolist()

    def reached(self, step: int) -> float | None:
        """The time of the first kept point at or past this step (None: not reached yet)."""
        return next((t for t, x in zip(self.t, self.step) if x >= step), None)

    def before(self, t: float) -> int | None:
        """The step of the last point at or before t."""
        return next((s for ts, s in zip(reversed(self.t), reversed(self.step)) if ts <= t), None)

    def step_at(self, t: float) -> int | None:
        v = self.at([t])
        return self.before(t) if v is None else round(v[0])
