"""The alert engine: pure detectors from a job's series to findings with advice.

The detectors consume a job's series as it grows (`Run`, bounded state, only the new points each
time) and a whole series at once is the same thing fed in one chunk, so the same series give the
same findings, live on ingest or when an old run is imported.
"""

from __future__ import annotations

from typing import Literal

from tunedeck.alerts.hardware import KINDS as HARDWARE_KINDS
from tunedeck.alerts.series import Finding, Limits, Point, Series
from tunedeck.alerts.stream import OutOfOrder, Run, feed_series

KINDS = (
    "vram_spike",
    "vram_periodic_spikes",
    "vram_near_oom",
    "vram_leak",
    "oom",
    "alloc_flush",
    "stall",
    "loss_nan",
    "loss_divergence",
    "loss_oscillation",
    "loss_stuck",
    "no_gradient",
    "fp16_overflow",
    "loss_overfit",
    "vram_plateau",
    "gpu_drift",
    *HARDWARE_KINDS,
)
Severity = Literal["info", "warning", "critical"]
SEVERITIES: tuple[Severity, ...] = ("info", "warning", "critical")
# The kinds that make a run's weights suspect, whatever its exit status: a NaN or diverged loss
# trained on garbage gradients, a loss stuck at its starting height learned nothing, and neither did
# a run whose gradients are exactly zero. Memory and
# progress alerts (near-OOM, spikes, a stall the run recovered from) say nothing about the result.
PROBLEM_KINDS = ("loss_nan", "loss_divergence", "loss_stuck", "no_gradient")


def at_least(severity: str, floor: str) -> bool:
    """Whether `severity` is `floor` or worse."""
    return SEVERITIES.index(severity) >= SEVERITIES.index(floor)


__all__ = [
    "KINDS",
    "PROBLEM_KINDS",
    "SEVERITIES",
    "at_least",
    "Finding",
    "Limits",
    "OutOfOrder",
    "Point",
    "Run",
    "Series",
    "analyze",
]


def analyze(s: Series, limits: Limits | None = None) -> list[Finding]:
    """Every condition the series show, one finding per (kind, gpu): the streaming detectors fed the
    whole series as one chunk."""
    return feed_series(Run(s, limits), s).findings(running=s.running, now=s.now)
