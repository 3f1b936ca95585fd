"""Who asked a job to stop: the cancelling token's name, for "stopped by NAME at step N".

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("cancelled_by", sa.String, nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "cancelled_by")  # SQLite >= 3.35 drops a column in place
