"""A change to an open alert (another occurrence, a new message or severity) counts as a change of its job.

0010 covers an alert opening or closing. A spike is now alerted as it rises and its alert updated as
the excursion evolves (its peak, its width, a second spike in the same episode): the job's row goes
into `job_changes` then too, so live streams send the job, and its open page reads the alerts again.

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        "CREATE TRIGGER job_changes_alert_update AFTER UPDATE OF count, message, severity ON alerts "
        "WHEN NEW.open AND (OLD.count IS NOT NEW.count OR OLD.message IS NOT NEW.message "
        "OR OLD.severity IS NOT NEW.severity) BEGIN "
        "INSERT OR REPLACE INTO job_changes(job_id) VALUES (NEW.job_id); END"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER job_changes_alert_update")
