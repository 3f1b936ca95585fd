"""Memory samples from the runners' samplers, and alerts.

Revision ID: 0002
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "memory_samples",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("line", sa.Integer, nullable=False),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("gpu", sa.Integer, nullable=False),
        sa.Column("used_bytes", sa.BigInteger, nullable=False),
        sa.Column("total_bytes", sa.BigInteger, nullable=True),
        sa.Column("util", sa.Float, nullable=True),
        sa.Column("power_w", sa.Float, nullable=True),
        sa.Column("temp_c", sa.Float, nullable=True),
        sa.Column("name", sa.String, nullable=True),
        sa.UniqueConstraint("job_id", "line", name="uq_memory_job_line"),
    )
    op.create_index("ix_memory_job_gpu_t", "memory_samples", ["job_id", "gpu", "t"])
    op.create_table(
        "alerts",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("severity", sa.String, nullable=False),
        sa.Column("gpu", sa.Integer, nullable=True),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("step", sa.Integer, nullable=True),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("suggestion", sa.Text, nullable=True),
        sa.Column("open", sa.Boolean, nullable=False),
        sa.Column("first_t", sa.Float, nullable=False),
        sa.Column("last_t", sa.Float, nullable=False),
        sa.Column("count", sa.Integer, nullable=False),
    )
    op.create_index("ix_alerts_job_kind", "alerts", ["job_id", "kind", "gpu"])
    op.create_index("ix_alerts_open", "alerts", ["open"])


def downgrade() -> None:
    op.drop_index("ix_alerts_open", "alerts")
    op.drop_index("ix_alerts_job_kind", "alerts")
    op.drop_table("alerts")
    op.drop_index("ix_memory_job_gpu_t", "memory_samples")
    op.drop_table("memory_samples")
