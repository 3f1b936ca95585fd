"""Retention: old memory samples go, their chart tiles stay.

For jobs that ended more than `memory_raw_retention_days` ago, the raw memory samples are deleted
but for each GPU's highest and newest sample (so the measured peak, the device's name and its size
stay known), and so are the chart tiles narrower than `memory_rollup_s` (the bytes' and the
utilisation's and temperatures' beside them). The job page then draws the job from the coarser
tiles, every spike still there: a tile's max is a real sample. Pruning
twice changes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from sqlalchemy import Engine, text

from tunedeck.config import Settings
from tunedeck.services.charts import pyramid
from tunedeck.services.charts.memory import DEVICES
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.retention")

# Per device of the job (one index step each): its highest sample and its newest.
KEEP = (
    DEVICES
    + """SELECT
  (SELECT id FROM memory_samples WHERE job_id = :job AND node = g.node AND gpu = g.gpu
   ORDER BY used_bytes DESC, t LIMIT 1),
  (SELECT id FROM memory_samples WHERE job_id = :job AND node = g.node AND gpu = g.gpu ORDER BY t DESC LIMIT 1)
FROM g
"""
)


# A sample's tiles: its bytes' and its readings' (utilisation, temperatures), pruned alike.
SAMPLE_TILES = " OR ".join(f"series LIKE '{kind}.%'" for kind in pyramid.KINDS)


def keep_level(interval_s: float) -> int:
    """The finest pyramid level whose tiles are at least `interval_s` seconds wide."""
    return next(
        (k for k in range(pyramid.FINEST, pyramid.LEVELS + 1) if 4.0**k >= interval_s), pyramid.LEVELS
    )


def due_jobs(engine: Engine, *, older_than_s: float, now: float | None = None) -> list[int]:
    """Ended jobs past the raw-retention age whose raw samples are still there. The age counts from
    the later of the end and the record's creation: an imported run ends when it ended (its own times),
    maybe months ago, but its samples came here at the import and are kept as long from then."""
    cutoff = (now or time.time()) - older_than_s
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT j.id FROM jobs j WHERE j.status IN ('succeeded','failed','cancelled') "
                "AND j.finished_at IS NOT NULL AND max(CAST(strftime('%s', j.finished_at) AS INTEGER), "
                "coalesce(CAST(strftime('%s', j.created_at) AS INTEGER), 0)) < :cutoff "
                "AND NOT EXISTS (SELECT 1 FROM chart_pruned p WHERE p.job_id = j.id) "
                "AND EXISTS (SELECT 1 FROM memory_samples s WHERE s.job_id = j.id) ORDER BY j.id"
            ),
            {"cutoff": int(cutoff)},
        )
        return [r[0] for r in rows]


def prune_job(engine: Engine, job_id: int, *, level: int) -> tuple[int, int]:
    """Drop one job's raw samples and its tiles below `level`; returns (samples before, after)."""
    count = text("SELECT count(*) FROM memory_samples WHERE job_id = :j")
    with engine.begin() as c:
        pyramid.catch_up(c)  # nothing goes before the tiles hold it
        cur = c.connection.cursor()
        try:
            pyramid.settle(cur, [job_id])  # its open tiles into the levels that stay
        finally:
            cur.close()
        before = c.execute(count, {"j": job_id}).scalar_one()
        keep = sorted({i for pair in c.execute(text(KEEP), {"job": job_id}) for i in pair})
        c.execute(
            text(f"DELETE FROM memory_samples WHERE job_id = :j AND id NOT IN ({', '.join(map(str, keep))})"),
            {"j": job_id},
        )
        c.execute(
            text(f"DELETE FROM chart_tiles WHERE job_id = :j AND ({SAMPLE_TILES}) AND level < :level"),
            {"j": job_id, "level": level},
        )
        c.execute(
            text("INSERT INTO chart_pruned (job_id, level) VALUES (:j, :level)"),
            {"j": job_id, "level": level},
        )
        # SQLite hands the ids above the highest one left out again: the watermark must not sit above them.
        c.execute(
            text(
                "UPDATE chart_state SET through_id = min(through_id, coalesce((SELECT max(id) FROM memory_samples), 0)) "
                "WHERE source = 'memory'"
            )
        )
        after = c.execute(count, {"j": job_id}).scalar_one()
    return before, after


def rollup(engine: Engine, *, older_than_s: float, interval_s: float, now: float | None = None) -> dict:
    """Prune every job that is due; one transaction per job so a long pass never blocks ingest long."""
    report = {"jobs": 0, "before": 0, "after": 0}
    for job_id in due_jobs(engine, older_than_s=older_than_s, now=now):
        before, after = prune_job(engine, job_id, level=keep_level(interval_s))
        report["jobs"] += 1
        report["before"] += before
        report["after"] += after
    return report


class Retention(Worker):
    """Prunes due jobs every `retention_check_s` while `memory_raw_retention_days` is set."""

    name = "retention"
    delay_s = 60.0  # not during start-up

    def __init__(self, engine: Engine, settings: Settings, *, pruned: Callable[[], None] = lambda: None):
        super().__init__()
        self.engine, self.settings, self.pruned = engine, settings, pruned
        self.interval_s = settings.retention_check_s

    def run_once(self) -> None:
        days = self.settings.memory_raw_retention_days
        if not days:
            return
        report = rollup(self.engine, older_than_s=days * 86400, interval_s=self.settings.memory_rollup_s)
        if report["jobs"]:
            self.pruned()
            log.info(
                "retention: pruned %s job(s) to their chart tiles, %s → %s samples",
                report["jobs"],
                report["before"],
                report["after"],
            )
