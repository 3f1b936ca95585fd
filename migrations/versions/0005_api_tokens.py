"""API tokens with roles.

Revision ID: 0005
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String, nullable=False),
        sa.Column("role", sa.String, nullable=False),
        sa.Column("token_hash", sa.String, nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("revoked_at", sa.DateTime, nullable=True),
    )
    op.create_index("ix_api_tokens_name", "api_tokens", ["name"])


def downgrade() -> None:
    op.drop_index("ix_api_tokens_name", "api_tokens")
    op.drop_table("api_tokens")
