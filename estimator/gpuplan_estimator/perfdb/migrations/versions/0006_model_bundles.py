"""Model bundles live in the database, versioned (issue #17): the bundle bytes, the data and
commit they were trained from, their held-out metrics, and a state (candidate, active,
retired). A partial unique index keeps at most one active bundle even against a writer that
bypasses the store.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision: str | None = "0005"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``model_bundles`` and its one-active index."""
    op.create_table(
        "model_bundles",
        # AUTOINCREMENT on SQLite: a version number is never handed out twice.
        sa.Column("version", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("bundle_bytes", sa.LargeBinary, nullable=False),
        sa.Column("bundle_sha256", sa.String(64), nullable=False),
        sa.Column("size_bytes", sa.Integer, nullable=False),
        sa.Column("data_digest", sa.String(128), nullable=False, server_default=""),
        sa.Column("rows", sa.BigInteger, nullable=True),
        sa.Column("git_commit", sa.String(64), nullable=False, server_default=""),
        sa.Column("metrics_json", sa.Text, nullable=False, server_default="{}"),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text, nullable=False, server_default=""),
        sa.Column("state_changed_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("state IN ('candidate', 'active', 'retired')",
                           name="ck_model_bundles_state"),
        sqlite_autoincrement=True,
    )
    op.create_index("uq_model_bundles_one_active", "model_bundles", ["state"], unique=True,
                    sqlite_where=sa.text("state = 'active'"),
                    postgresql_where=sa.text("state = 'active'"))


def downgrade() -> None:
    """Drop ``model_bundles``."""
    op.drop_index("uq_model_bundles_one_active", table_name="model_bundles")
    op.drop_table("model_bundles")
