"""Host probes per node type (issue #30): how fast a node's CPU issues PyTorch work
(`bench.host_probe`), measured by every `gpuplan bench` on its node, so estimates on that GPU
type price the host timeline (`step.host`) with the node's own per-op costs. One row per probe;
``digest`` (SHA-256 of device, figures and provenance) keeps a re-imported export from storing
it twice. ``run_id`` names the benchmark run it was measured with (NULL when imported without
one); it is no foreign key: a probe stays a valid measurement of its node when the run is
deleted.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision: str | None = "0007"
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    """Create ``host_probes`` with its per-device and per-node-type indexes."""
    op.create_table(
        "host_probes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("digest", sa.String(64), nullable=False, unique=True),
        sa.Column("node_type", sa.String(400), nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("cpu_model", sa.String(256), nullable=False),
        sa.Column("probe_version", sa.Integer, nullable=False),
        sa.Column("figures_json", sa.Text, nullable=False),
        sa.Column("provenance_json", sa.Text, nullable=False),
        sa.Column("run_id", sa.Integer, nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_host_probes_device", "host_probes", ["device", "probe_version"])
    op.create_index("ix_host_probes_node_type", "host_probes", ["node_type", "probe_version"])


def downgrade() -> None:
    """Drop ``host_probes``."""
    op.drop_index("ix_host_probes_node_type", table_name="host_probes")
    op.drop_index("ix_host_probes_device", table_name="host_probes")
    op.drop_table("host_probes")
