"""Measurements record the mean SM clock sampled by NVML while the row was timed.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision: str | None = "0001"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable ``measurements.sm_clock_mhz`` column."""
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("sm_clock_mhz", sa.Float, nullable=True))


def downgrade() -> None:
    """Drop ``measurements.sm_clock_mhz``."""
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("sm_clock_mhz")
