"""Issue 4 (UI): a change sequence over jobs kept by SQLite triggers; an index for chart windows.

Job rows are state, not an append-only log, so the SSE stream cannot page them by row id.
Every INSERT/UPDATE of a job replaces that job's row here with a fresh AUTOINCREMENT `seq`
(never reused), so "jobs changed after cursor j" is `seq > j`, whatever code path changed it:
scheduler, cancel, ingest progress. One row per job: the table stays as small as `jobs`.

Revision ID: 0004_ui
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_ui"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "job_changes",
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.Integer, nullable=False, unique=True),
        sqlite_autoincrement=True,
    )
    for when in ("INSERT", "UPDATE"):
        op.execute(
            f"CREATE TRIGGER job_changes_{when.lower()} AFTER {when} ON jobs BEGIN "
            "INSERT OR REPLACE INTO job_changes(job_id) VALUES (NEW.id); END"
        )
    op.execute("INSERT INTO job_changes(job_id) SELECT id FROM jobs ORDER BY id")
    # Chart series read one job's points by step (a zoomed window is a step range).
    op.create_index("ix_metric_job_step", "metric_points", ["job_id", "step"])


def downgrade() -> None:
    op.drop_index("ix_metric_job_step", "metric_points")
    op.execute("DROP TRIGGER job_changes_insert")
    op.execute("DROP TRIGGER job_changes_update")
    op.drop_table("job_changes")
