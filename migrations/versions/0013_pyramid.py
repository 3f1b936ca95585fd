"""Chart tiles (the pyramid), the id each raw table is tiled through, and jobs whose raw samples went.

The tiles are derived data: the server tiles every stored row on its first chart read after this
step (the watermarks start at 0), and a step down drops them. `memory_rollups` stays as it was:
nothing writes it any more, and its rows are kept.

Revision ID: 0013
Revises: 0012
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

# The tile columns as this revision knows them (a migration must not follow later code).
FIELDS = ("n", *(f"{c}_{p}" for p in ("min", "max", "first", "last") for c in "xya"))


def upgrade() -> None:
    op.create_table(
        "chart_tiles",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("series", sa.String, primary_key=True),
        sa.Column("level", sa.Integer, primary_key=True),
        sa.Column("tile", sa.Integer, primary_key=True),
        sa.Column("n", sa.Integer, nullable=False),
        *(sa.Column(f, sa.Float, nullable=False) for f in FIELDS[1:]),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "chart_state",
        sa.Column("source", sa.String, primary_key=True),
        sa.Column("through_id", sa.Integer, nullable=False),
    )
    op.bulk_insert(
        sa.table("chart_state", sa.column("source", sa.String), sa.column("through_id", sa.Integer)),
        [{"source": "memory", "through_id": 0}, {"source": "metrics", "through_id": 0}],
    )
    op.create_table(
        "chart_pruned",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("level", sa.Integer, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("chart_pruned")
    op.drop_table("chart_state")
    op.drop_table("chart_tiles")
