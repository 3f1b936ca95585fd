"""How many nodes a job spans (the ray executor places one runner on each).

Revision ID: 0016
Revises: 0015
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("nodes", sa.Integer, nullable=False, server_default="1"))


def downgrade() -> None:
    op.drop_column("jobs", "nodes")  # SQLite >= 3.35 drops a column in place
