"""One job outcome per job uid: duplicates removed (the first report kept), then a unique index.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision: str | None = "0003"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Delete every outcome but the lowest id of its job uid; make ``job_uid`` unique."""
    # The first report is the one the operator sent when the job finished; later ones are
    # retries or replays, which pushed the calibration factor further each time.
    op.execute(
        "DELETE FROM job_outcomes WHERE id NOT IN "
        "(SELECT MIN(id) FROM job_outcomes GROUP BY job_uid)"
    )
    op.drop_index("ix_job_outcomes_job_uid", table_name="job_outcomes")
    op.create_index("ix_job_outcomes_job_uid", "job_outcomes", ["job_uid"], unique=True)


def downgrade() -> None:
    """Back to a plain (non-unique) index; the deleted duplicates stay deleted."""
    op.drop_index("ix_job_outcomes_job_uid", table_name="job_outcomes")
    op.create_index("ix_job_outcomes_job_uid", "job_outcomes", ["job_uid"])
