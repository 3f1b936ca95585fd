"""Per-interval memory rollups for retention.

Revision ID: 0006
Revises: 0004_ui
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0004_ui"
branch_labels = None
depends_on = None


def upgrade() -> None:
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


def downgrade() -> None:
    op.drop_table("memory_rollups")
