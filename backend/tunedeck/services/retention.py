"""Retention: old memory samples are rolled up, not deleted.

For jobs that ended more than `memory_raw_retention_days` ago, each `memory_rollup_s` interval of
each GPU keeps its lowest and its highest real sample in `memory_samples` (so charts, downsampling
and spike evidence still work unchanged) and its count, min, max and mean go to `memory_rollups`.
Everything else in the interval is deleted. Rolling up twice changes nothing.
"""

from __future__ import annotations

import logging
import time

from sqlalchemy import Engine, text

from tunedeck.config import Settings
from tunedeck.workers import Worker

log = logging.getLogger("tunedeck.retention")

ROLLUP = """
INSERT OR IGNORE INTO memory_rollups (job_id, gpu, t0, t1, n, min_bytes, max_bytes, mean_bytes)
SELECT job_id, gpu, CAST(t / :w AS INTEGER) * :w, CAST(t / :w AS INTEGER) * :w + :w,
       count(*), min(used_bytes), max(used_bytes), avg(used_bytes)
FROM memory_samples WHERE job_id = :job GROUP BY job_id, gpu, CAST(t / :w AS INTEGER)
"""
# Keep the first sample holding each interval's min and max; delete the rest.
PRUNE = """
DELETE FROM memory_samples WHERE job_id = :job AND id NOT IN (
  SELECT (SELECT s.id FROM memory_samples s WHERE s.job_id = r.job_id AND s.gpu = r.gpu
          AND s.t >= r.t0 AND s.t < r.t1 AND s.used_bytes = r.max_bytes ORDER BY s.id LIMIT 1)
  FROM memory_rollups r WHERE r.job_id = :job
  UNION
  SELECT (SELECT s.id FROM memory_samples s WHERE s.job_id = r.job_id AND s.gpu = r.gpu
          AND s.t >= r.t0 AND s.t < r.t1 AND s.used_bytes = r.min_bytes ORDER BY s.id LIMIT 1)
  FROM memory_rollups r WHERE r.job_id = :job)
"""


def due_jobs(engine: Engine, *, older_than_s: float, now: float | None = None) -> list[int]:
    """Ended jobs past the raw-retention age that still hold more samples than their rollups keep."""
    cutoff = (now or time.time()) - older_than_s
    with engine.connect() as c:
        rows = c.execute(
            text(
                "SELECT j.id FROM jobs j WHERE j.status IN ('succeeded','failed','cancelled') "
                "AND j.finished_at IS NOT NULL AND CAST(strftime('%s', j.finished_at) AS INTEGER) < :cutoff "
                "AND (SELECT count(*) FROM memory_samples s WHERE s.job_id = j.id) > "
                "    2 * (SELECT count(*) FROM memory_rollups r WHERE r.job_id = j.id) ORDER BY j.id"
            ),
            {"cutoff": int(cutoff)},
        )
        return [r[0] for r in rows]


def rollup_job(engine: Engine, job_id: int, *, interval_s: float) -> tuple[int, int]:
    """Roll one job's samples up; returns (samples before, samples after)."""
    with engine.begin() as c:
        before = c.execute(
            text("SELECT count(*) FROM memory_samples WHERE job_id = :j"), {"j": job_id}
        ).scalar()
        c.execute(text(ROLLUP), {"job": job_id, "w": interval_s})
        c.execute(text(PRUNE), {"job": job_id})
        after = c.execute(
            text("SELECT count(*) FROM memory_samples WHERE job_id = :j"), {"j": job_id}
        ).scalar()
    return before, after


def rollup(engine: Engine, *, older_than_s: float, interval_s: float, now: float | None = None) -> dict:
    """Roll up every job that is due; one transaction per job so a long pass never blocks ingest long."""
    report = {"jobs": 0, "before": 0, "after": 0}
    for job_id in due_jobs(engine, older_than_s=older_than_s, now=now):
        before, after = rollup_job(engine, job_id, interval_s=interval_s)
        report["jobs"] += 1
        report["before"] += before
        report["after"] += after
    return report


class Retention(Worker):
    """Rolls up due jobs every `retention_check_s` while `memory_raw_retention_days` is set."""

    name = "retention"
    delay_s = 60.0  # not during start-up

    def __init__(self, engine: Engine, settings: Settings):
        super().__init__()
        self.engine, self.settings = engine, settings
        self.interval_s = settings.retention_check_s

    def run_once(self) -> None:
        days = self.settings.memory_raw_retention_days
        if not days:
            return
        report = rollup(self.engine, older_than_s=days * 86400, interval_s=self.settings.memory_rollup_s)
        if report["jobs"]:
            log.info(
                "retention: rolled up %s job(s), %s → %s samples",
                report["jobs"],
                report["before"],
                report["after"],
            )
