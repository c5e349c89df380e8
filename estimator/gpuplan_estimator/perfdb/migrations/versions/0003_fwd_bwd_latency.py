"""Measurements record forward+backward time with autograd (the torch backend times both).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision: str | None = "0002"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add the nullable ``measurements.fwd_bwd_latency_ms`` column."""
    with op.batch_alter_table("measurements") as batch:
        batch.add_column(sa.Column("fwd_bwd_latency_ms", sa.Float, nullable=True))


def downgrade() -> None:
    """Drop ``measurements.fwd_bwd_latency_ms``."""
    with op.batch_alter_table("measurements") as batch:
        batch.drop_column("fwd_bwd_latency_ms")
