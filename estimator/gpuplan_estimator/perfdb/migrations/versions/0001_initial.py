"""Initial schema: devices, benchmark_runs, measurements, model_versions, job_outcomes.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    """Create the five tables and their indexes."""
    op.create_table(
        "devices",
        sa.Column("key", sa.String(128), primary_key=True),
        sa.Column("name", sa.String(256), nullable=False),
        sa.Column("vendor", sa.String(32), nullable=False),
        sa.Column("nvml_name", sa.String(256), nullable=False),
        sa.Column("nvml_uuid", sa.String(128), nullable=False),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("first_seen", _TS, nullable=False),
        sa.Column("last_seen", _TS, nullable=False),
    )
    op.create_table(
        "benchmark_runs",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("backend", sa.String(128), nullable=False),
        sa.Column("backend_version", sa.String(64), nullable=False),
        sa.Column("host", sa.String(256), nullable=False),
        sa.Column("git_commit", sa.String(64), nullable=False),
        sa.Column("command", sa.Text, nullable=False),
        sa.Column("started_at", _TS, nullable=False),
        sa.Column("ended_at", _TS, nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("sweep_digest", sa.String(64), nullable=False),
        sa.Column("source", sa.Text, nullable=False),
        sa.Column("plan_json", sa.Text, nullable=False),
        sa.Column("settings_json", sa.Text, nullable=False),
    )
    op.create_index("ix_benchmark_runs_device", "benchmark_runs", ["device"])
    op.create_index("ix_benchmark_runs_sweep_digest", "benchmark_runs", ["sweep_digest"])
    op.create_table(
        "measurements",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column(
            "run_id",
            sa.Integer,
            sa.ForeignKey("benchmark_runs.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("backend", sa.String(128), nullable=False),
        sa.Column("kernel", sa.String(32), nullable=False),
        sa.Column("op", sa.String(64), nullable=False),
        sa.Column("dtype", sa.String(16), nullable=False),
        sa.Column("dims", sa.String(1024), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("feature_schema_version", sa.Integer, nullable=False),
        sa.Column("latency_ms", sa.Float, nullable=False),
        sa.Column("latency_std_ms", sa.Float, nullable=True),
        sa.Column("latency_min_ms", sa.Float, nullable=True),
        sa.Column("repeats", sa.Integer, nullable=False),
        sa.Column("power_watts", sa.Float, nullable=True),
        sa.Column("energy_mj", sa.Float, nullable=True),
        sa.Column("source", sa.Text, nullable=False),
        sa.UniqueConstraint(
            "run_id", "device", "backend", "kernel", "op", "dtype", "dims", "seq",
            name="uq_measurements_key",
        ),
    )
    op.create_index("ix_measurements_device_kernel", "measurements", ["device", "kernel"])
    op.create_table(
        "model_versions",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("created_at", _TS, nullable=False),
        sa.Column("data_digest", sa.String(128), nullable=False),
        sa.Column("metrics_json", sa.Text, nullable=False),
        sa.Column("bundle_path", sa.Text, nullable=False),
    )
    op.create_table(
        "job_outcomes",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_uid", sa.String(128), nullable=False),
        sa.Column("device", sa.String(128), nullable=False),
        sa.Column("gpu_count", sa.Integer, nullable=False),
        sa.Column("estimated_seconds", sa.Float, nullable=False),
        sa.Column("actual_seconds", sa.Float, nullable=False),
        sa.Column("model_digest", sa.String(128), nullable=False),
        sa.Column("created_at", _TS, nullable=False),
    )
    op.create_index("ix_job_outcomes_job_uid", "job_outcomes", ["job_uid"])


def downgrade() -> None:
    """Drop the five tables, dependents first."""
    op.drop_table("job_outcomes")
    op.drop_table("model_versions")
    op.drop_table("measurements")
    op.drop_table("benchmark_runs")
    op.drop_table("devices")
