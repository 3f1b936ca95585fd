"""When a job was evaluating: trainer_log.jsonl writes an eval_loss point when an evaluation ends, at
the step it followed, so an eval phase runs from the end of that step to the point.

Memory that rises for the length of each eval phase (eval batches, logits of the whole eval batch)
and drops back is the run working as configured; the memory detectors leave it out."""

from __future__ import annotations

from collections import deque

import numpy as np

from tunedeck.alerts.series import Point, median

PHASES = 4096  # eval phases kept: one every few minutes for days of a run
PACE = 32  # step durations a step's usual duration is the median of


class EvalPhases:
    """The eval phases of a job, from its points in order."""

    def __init__(self) -> None:
        self.phases: deque[tuple[float, float]] = deque(maxlen=PHASES)
        self.pace: deque[float] = deque(maxlen=PACE)  # seconds per step between training points
        self.last: tuple[float, int] | None = None  # (t, step) of the last training point
        self.after_eval = False  # the last training point came before an eval: its gap holds the eval

    def feed(self, p: Point) -> None:
        if p.step is None:
            return
        if p.eval_loss is not None and p.loss is None:
            self.phases.append((self._step_end(p.step), p.t))
            self.after_eval = True
            return
        if self.last is not None and p.step > self.last[1] and not self.after_eval:
            self.pace.append((p.t - self.last[0]) / (p.step - self.last[1]))
        self.last, self.after_eval = (p.t, p.step), False

    def step_s(self) -> float:
        return median(self.pace) if self.pace else 0.0

    def _step_end(self, step: int) -> float:
        """When training step `step` ended: the last training point, moved on by the steps since."""
        if self.last is None:
            return -np.inf
        t, k = self.last
        return t + max(0, step - k) * self.step_s()

    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, ends) of the phases, in time order."""
        a = np.fromiter((x for x, _ in self.phases), np.float64, len(self.phases))
        b = np.fromiter((y for _, y in self.phases), np.float64, len(self.phases))
        return a, b


def in_phase(spans: tuple[np.ndarray, np.ndarray], t0: float, margin: float) -> bool:
    """Whether something that began at t0 began with or during an eval phase (to within margin)."""
    starts, ends = spans
    i = int(np.searchsorted(starts, t0 + margin, side="right")) - 1  # the last phase begun by then
    return i >= 0 and t0 <= ends[i] + margin
