"""Jobs, metric points and log lines.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

STATUS = sa.Enum("queued", "running", "succeeded", "failed", "cancelled", name="jobstatus", native_enum=False)


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String, nullable=False),
        sa.Column("owner", sa.String, nullable=True),
        sa.Column("status", STATUS, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("spec", sa.Text, nullable=False),
        sa.Column("train_yaml", sa.Text, nullable=False),
        sa.Column("ds_config", sa.Text, nullable=True),
        sa.Column("run_dir", sa.String, nullable=False),
        sa.Column("output_dir", sa.String, nullable=False),
        sa.Column("devices", sa.String, nullable=True),
        sa.Column("exit_code", sa.Integer, nullable=True),
        sa.Column("error", sa.String, nullable=True),
        sa.Column("created_at", sa.DateTime, nullable=False),
        sa.Column("started_at", sa.DateTime, nullable=True),
        sa.Column("finished_at", sa.DateTime, nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime, nullable=True),
        sa.Column("current_steps", sa.Integer, nullable=True),
        sa.Column("total_steps", sa.Integer, nullable=True),
        sa.Column("percentage", sa.Float, nullable=True),
        sa.Column("eta_seconds", sa.Float, nullable=True),
        sa.Column("runner_pid", sa.Integer, nullable=True),
        sa.Column("runner_started", sa.Float, nullable=True),
        sa.Column("trainer_pid", sa.Integer, nullable=True),
        sa.Column("runner_token_hash", sa.String, nullable=True),
        sa.Column("last_batch_seq", sa.Integer, nullable=False, server_default="-1"),
    )
    op.create_index("ix_jobs_status", "jobs", ["status"])
    op.create_table(
        "metric_points",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("line", sa.Integer, nullable=False),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("step", sa.Integer, nullable=True),
        sa.Column("total_steps", sa.Integer, nullable=True),
        sa.Column("loss", sa.Float, nullable=True),
        sa.Column("eval_loss", sa.Float, nullable=True),
        sa.Column("lr", sa.Float, nullable=True),
        sa.Column("epoch", sa.Float, nullable=True),
        sa.Column("throughput", sa.Float, nullable=True),
        sa.Column("total_tokens", sa.Integer, nullable=True),
        sa.Column("vram_allocated", sa.Float, nullable=True),
        sa.Column("vram_reserved", sa.Float, nullable=True),
        sa.Column("raw", sa.Text, nullable=False),
        sa.UniqueConstraint("job_id", "line", name="uq_metric_job_line"),
    )
    op.create_table(
        "log_lines",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.Integer, sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
        sa.Column("line", sa.Integer, nullable=False),
        sa.Column("t", sa.Float, nullable=False),
        sa.Column("stream", sa.String, nullable=False),
        sa.Column("text", sa.Text, nullable=False),
        sa.UniqueConstraint("job_id", "line", name="uq_log_job_line"),
    )


def downgrade() -> None:
    op.drop_table("log_lines")
    op.drop_table("metric_points")
    op.drop_index("ix_jobs_status", "jobs")
    op.drop_table("jobs")
