"""Job outcomes carry what a multi-GPU scaling fit needs: node shape, per-GPU batch, steps run
and the plan's single-GPU parts (issue #19). Nullable: older operators do not send them.

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision: str | None = "0004"
branch_labels: str | None = None
depends_on: str | None = None

COLUMNS = (
    ("gpus_per_node", sa.Integer),
    ("nodes", sa.Integer),
    ("per_gpu_batch", sa.Integer),
    ("steps", sa.BigInteger),
    ("forward_ms", sa.Float),
    ("backward_ms", sa.Float),
    ("optimizer_ms", sa.Float),
    # 8 bytes: a 7B-parameter model's bf16 gradients are already 14 GB.
    ("gradient_bytes", sa.BigInteger),
    ("intra_node_gbps", sa.Float),
)


def upgrade() -> None:
    """Add the nullable scaling columns to ``job_outcomes``; earlier rows keep NULL there."""
    with op.batch_alter_table("job_outcomes") as batch:
        for name, kind in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    """Drop the scaling columns."""
    with op.batch_alter_table("job_outcomes") as batch:
        for name, _ in reversed(COLUMNS):
            batch.drop_column(name)
