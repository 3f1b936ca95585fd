"""An index on jobs.finished_at: /metrics finds the recently ended jobs without reading every job row.

Revision ID: 0007_jobs_finished
Revises: 0006
"""

from alembic import op

revision = "0007_jobs_finished"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_finished_at", "jobs", ["finished_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_finished_at", table_name="jobs")
