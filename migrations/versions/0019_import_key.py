"""An imported run's key: the hash of its files, name and owner, unique, so the same import sent
again (a retry after a dropped answer) finds its job instead of making a second one.

Revision ID: 0019
Revises: 0018
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("import_key", sa.String, nullable=True))
    op.create_index("ix_jobs_import_key", "jobs", ["import_key"], unique=True)


def downgrade() -> None:
    op.drop_index("ix_jobs_import_key", "jobs")
    op.drop_column("jobs", "import_key")  # SQLite >= 3.35 drops a column in place
