"""Team presets: job YAMLs saved by name (unique) with their owner and a description, beside the
read-only presets the package ships in configs/.

Revision ID: 0022
Revises: 0021
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "team_presets",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String, nullable=False, unique=True),
        sa.Column("owner", sa.String, nullable=True),
        sa.Column("description", sa.String, nullable=False),
        sa.Column("text", sa.String, nullable=False),
        sa.Column("created_at", sa.DateTime, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("team_presets")
