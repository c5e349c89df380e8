"""Plans keep their workload, and job outcomes name it (issue #17): the promotion gate
re-estimates finished TrainingJobs with the candidate and the active bundle. ``plan_workloads``
holds each plan's zstd-compressed work items keyed by their SHA-256; ``job_outcomes.workload_id``
links an outcome to the plan it ran (NULL for outcomes reported before, or by older operators).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision: str | None = "0006"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``plan_workloads``; add the nullable, indexed ``job_outcomes.workload_id``."""
    op.create_table(
        "plan_workloads",
        sa.Column("workload_id", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("gpu_count", sa.Integer, nullable=False),
        sa.Column("size_bytes", sa.Integer, nullable=False),
        sa.Column("workload_zstd", sa.LargeBinary, nullable=False),
    )
    with op.batch_alter_table("job_outcomes") as batch:
        batch.add_column(sa.Column("workload_id", sa.String(64), nullable=True))
        batch.create_index("ix_job_outcomes_workload_id", ["workload_id"])


def downgrade() -> None:
    """Drop the link and the table."""
    with op.batch_alter_table("job_outcomes") as batch:
        batch.drop_index("ix_job_outcomes_workload_id")
        batch.drop_column("workload_id")
    op.drop_table("plan_workloads")
