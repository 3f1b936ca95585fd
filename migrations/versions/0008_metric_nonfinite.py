"""Non-finite metric values: NULL in their columns, named in `nonfinite` (strict JSON out).

Rows stored before held Infinity in their columns and NaN as NULL (SQLite has no NaN): both are
read again from the line as written.

Revision ID: 0008
Revises: 0007_jobs_finished
"""

import json
import math

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007_jobs_finished"
branch_labels = None
depends_on = None

# The metric columns as this revision knows them (a migration must not follow later code).
COLUMNS = (
    "loss",
    "eval_loss",
    "lr",
    "epoch",
    "throughput",
    "total_tokens",
    "vram_allocated",
    "vram_reserved",
)


def _bad(raw: str) -> dict[str, str]:
    try:
        d = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(d, dict):
        return {}
    return {
        k: "nan" if math.isnan(v) else "inf" if v > 0 else "-inf"
        for k in COLUMNS
        if isinstance(v := d.get(k), float) and not math.isfinite(v)
    }


def upgrade() -> None:
    op.add_column("metric_points", sa.Column("nonfinite", sa.Text, nullable=True))
    op.create_index(
        "ix_metric_nonfinite",
        "metric_points",
        ["job_id", "id"],
        sqlite_where=sa.text("nonfinite IS NOT NULL"),
    )
    conn = op.get_bind()
    rows = conn.execute(
        sa.text("SELECT id, raw FROM metric_points WHERE raw LIKE '%NaN%' OR raw LIKE '%Infinity%'")
    )
    for row_id, raw in rows.all():
        if bad := _bad(raw):
            sets = ", ".join(f"{k} = NULL" for k in bad)
            conn.execute(
                sa.text(f"UPDATE metric_points SET {sets}, nonfinite = :nf WHERE id = :id"),
                {"nf": json.dumps(bad), "id": row_id},
            )


def downgrade() -> None:
    op.drop_index("ix_metric_nonfinite", "metric_points")
    op.drop_column("metric_points", "nonfinite")  # SQLite >= 3.35 drops a column in place
