"""The hardware readings beside each memory sample: junction and HBM temperatures, the GPU whose power
covers this one (MI250X GCDs), ECC counts, throttle residency shares, the graphics clock, and, once a
device and on change, its serial, UUID, partition mode and ECC blocks.

Revision ID: 0021
Revises: 0020
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

COLUMNS = (
    ("temp_junction_c", sa.Float),
    ("temp_hbm_c", sa.Float),
    ("power_shared_with", sa.Integer),
    ("ecc_correctable", sa.BigInteger),
    ("ecc_uncorrectable", sa.BigInteger),
    ("throttle_power", sa.Float),
    ("throttle_thermal", sa.Float),
    ("throttle_hbm", sa.Float),
    ("clock_mhz", sa.Float),
    ("serial", sa.String),
    ("uuid", sa.String),
    ("partition", sa.String),
    ("ecc_blocks", sa.String),
)


def upgrade() -> None:
    # Nullable columns without a default: SQLite adds each in place, no copy of the table.
    for name, kind in COLUMNS:
        op.add_column("memory_samples", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(COLUMNS):
        op.drop_column("memory_samples", name)
