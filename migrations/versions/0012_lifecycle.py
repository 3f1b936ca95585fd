"""The fine-tune lifecycle: a resumed or cloned job's parent, tags and notes; grad_norm and the other
numbers of a logging step.

grad_norm gets a column of its own (charted on every run, read by step like loss); the rarer
numbers (eval_accuracy, rewards, runtimes, ...) differ by stage and dataset, so they go into one
JSON object per point rather than a column each.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("parent_id", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("tags", sa.Text, nullable=True))  # a JSON list of strings
    op.add_column("jobs", sa.Column("notes", sa.Text, nullable=True))
    op.create_index("ix_jobs_parent", "jobs", ["parent_id"])
    op.add_column("metric_points", sa.Column("grad_norm", sa.Float, nullable=True))
    op.add_column("metric_points", sa.Column("extra", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("metric_points", "extra")
    op.drop_column("metric_points", "grad_norm")
    op.drop_index("ix_jobs_parent", "jobs")
    op.drop_column("jobs", "notes")
    op.drop_column("jobs", "tags")
    op.drop_column("jobs", "parent_id")
