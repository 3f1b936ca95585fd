"""Drop memory_rollups: nothing has written or read it since the chart tiles (0013) replaced it.

Its rows summed up raw samples that older releases pruned; no page or route shows them, so they go
with the table. A step down makes the table again, empty.

Revision ID: 0014
Revises: 0013
"""

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_table("memory_rollups")


def downgrade() -> None:
    # As 0006 made it (a migration keeps its own copy of the columns, never today's models).
    op.create_table(
        "memory_rollups",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("gpu", sa.Integer, nullable=False),
        sa.Column("t0", sa.Float, nullable=False),
        sa.Column("t1", sa.Float, nullable=False),
        sa.Column("n", sa.Integer, nullable=False),
        sa.Column("min_bytes", sa.BigInteger, nullable=False),
        sa.Column("max_bytes", sa.BigInteger, nullable=False),
        sa.Column("mean_bytes", sa.Float, nullable=False),
        sa.UniqueConstraint("job_id", "gpu", "t0", name="uq_rollup_job_gpu_t0"),
    )
