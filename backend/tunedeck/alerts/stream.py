"""A job's detector state: fed its new samples, points and output lines as they come, in chunks of
any size, in bounded memory; the findings are read off it at any time."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

from tunedeck.alerts import drift
from tunedeck.alerts.hardware import Hardware
from tunedeck.alerts.memory import Gpu, OutOfOrder
from tunedeck.alerts.phases import EvalPhases
from tunedeck.alerts.series import Finding, Judging, Limits, Point, Series, Steps
from tunedeck.alerts.training import Training

__all__ = ["OutOfOrder", "Run"]


class Run:
    """`meta` carries the job's config, devices and GPU names (its sample lists are not read)."""

    def __init__(self, meta: Series, limits: Limits | None = None):
        self.meta, self.limits = meta, limits or Limits()
        self.gpus: dict[tuple[str, int], Gpu] = {}  # by (node, gpu): a job on several nodes repeats indices
        self.steps = Steps()
        self.training = Training(self.limits, meta.config)
        self.evals = EvalPhases()
        self.hardware = Hardware()  # ECC and throttle, from the samples' hardware readings
        self.last_point_t: float | None = None
        self.first_step: tuple[float, int] | None = None  # (t, step) of the first training point
        self.last_log_t: float | None = None

    def feed_memory(
        self,
        gpu: int,
        t: Sequence[float],
        used: Sequence[float],
        total: Sequence[float | None] | None = None,
        node: str = "",
    ) -> None:
        """One device's samples, in time order; OutOfOrder when older than what it has."""
        state = self.gpus.get((node, gpu))
        if state is None:
            state = self.gpus[(node, gpu)] = Gpu(gpu, self.limits)
        tot = np.zeros(len(t)) if total is None else np.array(total, dtype=np.float64)
        tot[np.isnan(tot)] = 0.0  # None: unknown
        state.feed(np.asarray(t, dtype=np.float64), np.asarray(used, dtype=np.float64), tot)

    def feed_hardware(self, gpu: int, t: Sequence[float], cols: dict, node: str = "") -> None:
        """One device's hardware readings (alerts.hardware.COLUMNS), in time order."""
        self.hardware.feed(node, gpu, t, cols)

    def feed_points(self, points: Iterable[Point]) -> None:
        points = list(points)
        self.hardware.feed_points(points)
        for p in points:
            self.training.feed_point(p)
            self.evals.feed(p)
            if p.step is not None:
                self.steps.add(p.t, p.step)
                if self.first_step is None and p.loss is not None:
                    self.first_step = (p.t, p.step)
            self.last_point_t = p.t

    def feed_logs(self, logs: Iterable[tuple[float, str]]) -> None:
        for t, line in logs:
            self.training.feed_log(t, line)
            self.last_log_t = t

    def end(self) -> float:
        ends = [g.t_last for g in self.gpus.values() if g.n] + [self.last_point_t, self.last_log_t]
        return max((x for x in ends if x is not None), default=0.0)

    def findings(self, *, running: bool, now: float | None = None) -> list[Finding]:
        """Every condition the series show so far, one finding per (kind, node, gpu)."""
        now = self.end() if now is None else now
        out: list[Finding] = []
        evals = (self.evals.spans(), self.evals.step_s())
        # Training began a first step's worth of steps before the first training point.
        loading = -math.inf if self.first_step is None else self.first_step[0] - self.first_step[1] * evals[1]
        saves = list(self.training.saves)
        j = Judging(self.meta, self.steps, self.limits, now, running)
        named = len({node for node, _ in self.gpus}) > 1  # one node: no node in the messages, as before
        for node, gpu in sorted(self.gpus):
            for f in self.gpus[(node, gpu)].findings(j, evals, saves, loading):
                f.node = node
                if named and node:
                    f.message = f"{node} {f.message}"  # "node-b GPU 0: ..."
                out.append(f)
        for f in drift.findings(self.gpus, j, loading):
            if named and f.node:
                f.message = f"{f.node} {f.message}"
            out.append(f)
        alive = max((g.t_last for g in self.gpus.values() if g.n), default=None)
        host = any(g.n for (_, gpu), g in self.gpus.items() if gpu == -1)
        gpus = bool(self.meta.devices) or any(gpu >= 0 for _, gpu in self.gpus)
        return out + self.training.findings(j, alive, host) + self.hardware.findings(j, gpus)


def feed_series(run: Run, s: Series) -> Run:
    """All of a Series into a Run, as one chunk per stream."""
    for key, xs in s.memory.items():
        node, gpu = key if isinstance(key, tuple) else ("", key)
        if xs:
            xs = sorted(xs, key=lambda x: x[0])
            run.feed_memory(gpu, [x[0] for x in xs], [x[1] for x in xs], [x[2] for x in xs], node)
    for key, (t, cols) in s.hardware.items():
        node, gpu = key if isinstance(key, tuple) else ("", key)
        run.feed_hardware(gpu, t, cols, node)
    run.feed_points(s.points)
    run.feed_logs(s.logs)
    return run
