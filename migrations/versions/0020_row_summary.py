"""What a job's team row shows, kept on the job as batches are stored: its peak VRAM, its largest
device, its newest loss (and that line's number). A row then costs the same however long the run:
the team feed reads these columns instead of the run's samples, tiles and points on every batch.
Filled here from what is stored: the peak from each device's top chart tile (which retention keeps),
the device size from its newest sample, the loss from the newest line that has one.

Revision ID: 0020
Revises: 0019
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

TOP = 12  # the chart tiles' top level when this was written (services/charts/pyramid.py LEVELS)
# The job's devices, one index seek each on the samples' key, then each one's top tile and newest
# sample: the queries the team feed ran on every batch until this revision (a copy: history).
PEAK = """
WITH RECURSIVE g(node, gpu) AS (
  SELECT * FROM (SELECT node, gpu FROM memory_samples WHERE job_id = :job ORDER BY node, gpu LIMIT 1)
  UNION ALL
  SELECT m.node, m.gpu FROM g JOIN memory_samples m ON m.id = coalesce(
    (SELECT id FROM memory_samples WHERE job_id = :job AND node = g.node AND gpu > g.gpu ORDER BY gpu LIMIT 1),
    (SELECT id FROM memory_samples WHERE job_id = :job AND node > g.node ORDER BY node, gpu LIMIT 1))
)
SELECT CAST(max((SELECT max(y_max) FROM chart_tiles WHERE job_id = :job AND level = :top AND series =
    CASE g.node WHEN '' THEN 'memory.' || g.gpu ELSE 'memory.' || g.node || '/' || g.gpu END)) AS INTEGER),
  max((SELECT total_bytes FROM memory_samples WHERE job_id = :job AND node = g.node AND gpu = g.gpu
    ORDER BY t DESC LIMIT 1))
FROM g
"""
LOSS = (
    "SELECT loss, json_extract(nonfinite, '$.loss'), line FROM metric_points WHERE job_id = :job AND "
    "(loss IS NOT NULL OR json_extract(nonfinite, '$.loss') IS NOT NULL) ORDER BY line DESC LIMIT 1"
)
COLUMNS = (
    ("peak_vram_bytes", sa.BigInteger),
    ("total_vram_bytes", sa.BigInteger),
    ("last_loss", sa.Float),
    ("last_loss_nonfinite", sa.String),
    ("last_loss_line", sa.BigInteger),
)


def upgrade() -> None:
    for name, kind in COLUMNS:
        op.add_column("jobs", sa.Column(name, kind, nullable=True))
    conn = op.get_bind()
    for (job,) in conn.execute(sa.text("SELECT id FROM jobs")).all():
        peak, total = conn.execute(sa.text(PEAK), {"job": job, "top": TOP}).one()
        loss = conn.execute(sa.text(LOSS), {"job": job}).first()
        conn.execute(
            sa.text(
                "UPDATE jobs SET peak_vram_bytes = :p, total_vram_bytes = :tb, last_loss = :l, "
                "last_loss_nonfinite = :nf, last_loss_line = :ln WHERE id = :job"
            ),
            {
                "p": peak,
                "tb": total,
                "l": loss[0] if loss else None,
                "nf": loss[1] if loss else None,
                "ln": loss[2] if loss else None,
                "job": job,
            },
        )


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column("jobs", name)  # SQLite >= 3.35 drops a column in place
