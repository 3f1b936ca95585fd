"""What a running job is doing, read by its runner from the trainer's output (runner/phases.py):
`phase` (loading_model, preparing_dataset, building_op, waiting_for_ranks, training, evaluating,
predicting, saving, exporting, serving) and `phase_at`, when that phase began. A finished job keeps
the last one (where a failed run was when it died). Old jobs have none.

Revision ID: 0023
Revises: 0022
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

COLUMNS = (
    ("phase", sa.String),
    ("phase_at", sa.DateTime),
)


def upgrade() -> None:
    # Nullable columns without a default: SQLite adds each in place, no copy of the table.
    for name, kind in COLUMNS:
        op.add_column("jobs", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column("jobs", name)  # SQLite >= 3.35 drops a column in place
