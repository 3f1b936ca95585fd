"""The VRAM estimate stored with each job, and predicted-vs-measured peaks per GPU kind.

Revision ID: 0003
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # A plain ALTER TABLE ADD COLUMN, not a batch table copy: a copy of `jobs` would lose any triggers on it.
    op.add_column("jobs", sa.Column("estimate", sa.Text, nullable=True))
    op.create_table(
        "estimate_calibrations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("gpu_kind", sa.String, nullable=False),
        sa.Column("predicted_bytes", sa.BigInteger, nullable=False),
        sa.Column("measured_bytes", sa.BigInteger, nullable=False),
        sa.Column("source", sa.String, nullable=False),
        sa.Column("ratio", sa.Float, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.UniqueConstraint("job_id", name="uq_calibration_job"),
    )
    op.create_index("ix_calibration_kind", "estimate_calibrations", ["gpu_kind"])


def downgrade() -> None:
    op.drop_index("ix_calibration_kind", "estimate_calibrations")
    op.drop_table("estimate_calibrations")
    op.drop_column("jobs", "estimate")  # SQLite >= 3.35 drops a column in place
