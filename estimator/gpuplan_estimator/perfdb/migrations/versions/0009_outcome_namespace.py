"""Job outcomes carry the TrainingJob's namespace (issue #33): the calibration bounds each
namespace's weight in a GPU type's factor, so one tenant moves the others' estimates by a
stated fraction at most. Earlier rows get "" (one tenant: they are weighed as before).

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision: str | None = "0008"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Add ``job_outcomes.namespace`` (63 characters: a Kubernetes namespace name)."""
    with op.batch_alter_table("job_outcomes") as batch:
        batch.add_column(sa.Column("namespace", sa.String(63), nullable=False,
                                   server_default=""))


def downgrade() -> None:
    """Drop ``job_outcomes.namespace``."""
    with op.batch_alter_table("job_outcomes") as batch:
        batch.drop_column("namespace")
