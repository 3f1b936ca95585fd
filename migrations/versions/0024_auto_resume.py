"""A job its allocation's time limit stopped with a checkpoint is resumed from it: `auto_resume` says
`pending` until the next attempt is made, then `resumed as job N`, or why it was not. Old jobs have none.

Revision ID: 0024
Revises: 0023
"""

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("auto_resume", sa.String, nullable=True))  # in place, no copy


def downgrade() -> None:
    op.drop_column("jobs", "auto_resume")
