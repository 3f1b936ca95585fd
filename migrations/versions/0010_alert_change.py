"""Alerts carry their suggestion as a config change; closing an alert counts as a change of its job.

`change` holds the suggested train.yaml keys and values as JSON (NULL when the advice is not a key
change). A trigger writes the job into `job_changes` whenever one of its alerts opens or closes: the
job's row as pages show it (open alerts, worst alert) changed, so live streams send it at once.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("alerts", sa.Column("change", sa.Text, nullable=True))
    op.execute(
        "CREATE TRIGGER job_changes_alert_open AFTER UPDATE OF open ON alerts "
        "WHEN OLD.open IS NOT NEW.open BEGIN "
        "INSERT OR REPLACE INTO job_changes(job_id) VALUES (NEW.job_id); END"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_changes_alert_open")
    op.drop_column("alerts", "change")  # SQLite >= 3.35 drops a column in place
