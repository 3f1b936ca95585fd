"""Open chart tiles: a series' newest finest tile is folded into the coarser levels once, when a
newer one opens, instead of every coarser level being upserted with every batch.

The table starts empty: a series without a row has every stored point in every level already, and
its next batch opens a tile only where that batch began it (services/charts/pyramid.py, `add`).

Revision ID: 0026
Revises: 0025
"""

import sqlalchemy as sa
from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chart_open",
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("series", sa.String, primary_key=True),
        sa.Column("tile", sa.Integer, nullable=False),
        sqlite_with_rowid=False,
    )


def downgrade() -> None:
    # Before dropping the marks, fold the open tiles up: the older code keeps every level current.
    conn = op.get_bind()
    from tunedeck.services.charts import pyramid

    jobs = [r[0] for r in conn.exec_driver_sql("SELECT DISTINCT job_id FROM chart_open")]
    cur = conn.connection.cursor()
    try:
        pyramid.settle(cur, jobs)
    finally:
        cur.close()
    op.drop_table("chart_open")
