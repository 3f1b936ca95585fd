"""Job kinds (train, eval, predict, export, chat) and the chat server's port, key and last use.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


# Plain ADD/DROP COLUMN: a batch (copy-and-move) rebuild of `jobs` would cascade-delete its series.
def upgrade() -> None:
    op.add_column("jobs", sa.Column("kind", sa.String, nullable=False, server_default="train"))
    op.add_column("jobs", sa.Column("api_port", sa.Integer, nullable=True))
    op.add_column("jobs", sa.Column("api_key", sa.String, nullable=True))
    op.add_column("jobs", sa.Column("last_used_at", sa.DateTime, nullable=True))


def downgrade() -> None:
    for column in ("last_used_at", "api_key", "api_port", "kind"):
        op.drop_column("jobs", column)  # SQLite >= 3.35 drops a column in place
