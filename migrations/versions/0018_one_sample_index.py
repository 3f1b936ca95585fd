"""Memory samples keep one index, not two: (job, node, device, time, line), unique.

The unique (job, node, line) and the (job, node, device, time) index each took an entry per stored
sample, and the second one, inserted at one place per device, cost the store most of a sample's
write. One index on (job, node, device, time, line) orders each device's series by time for the
chart and detector reads, as the second did, and keys a resend: a sample sent again is the same
sample, with the same device and time. A step down keeps one sample per (job, node, line), the
first stored, since the old key cannot hold more.

Revision ID: 0018
Revises: 0017
"""

from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("memory_samples", recreate="always") as b:
        b.drop_index("ix_memory_job_node_gpu_t")
        b.drop_constraint("uq_memory_job_node_line", type_="unique")
        b.create_unique_constraint("uq_memory_job_node_gpu_t_line", ["job_id", "node", "gpu", "t", "line"])


def downgrade() -> None:
    op.execute(
        "DELETE FROM memory_samples WHERE id NOT IN "
        "(SELECT min(id) FROM memory_samples GROUP BY job_id, node, line)"
    )
    with op.batch_alter_table("memory_samples", recreate="always") as b:
        b.drop_constraint("uq_memory_job_node_gpu_t_line", type_="unique")
        b.create_unique_constraint("uq_memory_job_node_line", ["job_id", "node", "line"])
        b.create_index("ix_memory_job_node_gpu_t", ["job_id", "node", "gpu", "t"])
