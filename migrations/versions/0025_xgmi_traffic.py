"""xGMI traffic beside each memory sample: the bytes read and written over the device's xGMI links,
cumulative since the driver loaded (AMD MI300 series; a rate is derived between two samples).

Revision ID: 0025
Revises: 0024
"""

import sqlalchemy as sa
from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

COLUMNS = (("xgmi_read_bytes", sa.BigInteger), ("xgmi_write_bytes", sa.BigInteger))


def upgrade() -> None:
    # Nullable columns without a default: SQLite adds each in place, no copy of the table.
    for name, kind in COLUMNS:
        op.add_column("memory_samples", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column("memory_samples", name)
