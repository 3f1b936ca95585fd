"""The alert engine: pure functions from a job's series to findings with advice.

The same series give the same findings, live on ingest or when an old run is imported.
"""

from __future__ import annotations

from tunedeck.alerts import memory, training
from tunedeck.alerts.series import Finding, Limits, Point, Series

KINDS = ("vram_spike", "vram_periodic_spikes", "vram_near_oom", "oom", "alloc_flush", "stall", "loss_nan",
         "loss_divergence", "loss_oscillation", "vram_plateau")
SEVERITIES = ("info", "warning", "critical")

__all__ = ["KINDS", "SEVERITIES", "Finding", "Limits", "Point", "Series", "analyze"]


def _end(s: Series) -> float:
    ends = [xs[-1][0] for xs in s.memory.values() if xs] + [p.t for p in s.points[-1:]] + [t for t, _ in s.logs[-1:]]
    return max(ends, default=0.0)


def analyze(s: Series, limits: Limits | None = None) -> list[Finding]:
    """Every condition the series show, one finding per (kind, gpu)."""
    lim = limits or Limits()
    now = s.now if s.now is not None else _end(s)
    return [*memory.detect(s, lim, now), *training.detect(s, lim, now)]
