"""Memory samples name their node (a job on several nodes has one runner, and one sample sequence,
per node); alerts name the node of their GPU; jobs may record where they were placed.

Rows from before this step get node '' (the job's single node): their chart tiles keep their keys.
A step down keeps one sample per (job, line), the first stored, since the old key cannot hold more.

Revision ID: 0015
Revises: 0014
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("memory_samples", recreate="always") as b:
        b.add_column(sa.Column("node", sa.String, nullable=False, server_default=""))
        b.drop_constraint("uq_memory_job_line", type_="unique")
        b.create_unique_constraint("uq_memory_job_node_line", ["job_id", "node", "line"])
        b.drop_index("ix_memory_job_gpu_t")
        b.create_index("ix_memory_job_node_gpu_t", ["job_id", "node", "gpu", "t"])
    # Plain ADD/DROP COLUMN for these two: a rebuild of `jobs` would cascade-delete its series.
    op.add_column("alerts", sa.Column("node", sa.String, nullable=False, server_default=""))
    op.add_column("jobs", sa.Column("placement", sa.Text, nullable=True))


def downgrade() -> None:
    op.execute(
        "DELETE FROM memory_samples WHERE id NOT IN (SELECT min(id) FROM memory_samples GROUP BY job_id, line)"
    )
    op.drop_column("jobs", "placement")
    op.drop_column("alerts", "node")
    with op.batch_alter_table("memory_samples", recreate="always") as b:
        b.drop_index("ix_memory_job_node_gpu_t")
        b.drop_constraint("uq_memory_job_node_line", type_="unique")
        b.create_unique_constraint("uq_memory_job_line", ["job_id", "line"])
        b.create_index("ix_memory_job_gpu_t", ["job_id", "gpu", "t"])
        b.drop_column("node")
