"""Saved alert states: a running job's detector state, so that a restarted server resumes it from
the rows stored after it instead of feeding the detectors every stored sample again.

The table starts empty: a job without a row is built from its stored series, as before.

Revision ID: 0027
Revises: 0026
"""

import sqlalchemy as sa
from alembic import op

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_states",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("upto_memory", sa.Integer, nullable=False),
        sa.Column("upto_metrics", sa.Integer, nullable=False),
        sa.Column("upto_logs", sa.Integer, nullable=False),
        sa.Column("state", sa.LargeBinary, nullable=False),
        sa.Column("saved_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("alert_states")
