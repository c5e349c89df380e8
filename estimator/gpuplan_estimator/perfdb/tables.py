"""ORM tables of the performance database (SQLAlchemy 2 declarative).

The schema is owned by the Alembic migrations in `migrations/versions`; these classes must match
them (a unit test compares the two).
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Declarative base of the performance database's tables."""


class Device(Base):
    """A device type seen by a benchmark: catalog key, NVML identity, spec, first/last seen."""
    __tablename__ = "devices"

    key: Mapped[str] = mapped_column(String(128), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    vendor: Mapped[str] = mapped_column(String(32), default="")
    nvml_name: Mapped[str] = mapped_column(String(256), default="")
    nvml_uuid: Mapped[str] = mapped_column(String(128), default="")
    spec_json: Mapped[str] = mapped_column(Text, default="{}")
    first_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class BenchmarkRun(Base):
    """One benchmark or import run: device, backend, provenance, status and its plan."""
    __tablename__ = "benchmark_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    device: Mapped[str] = mapped_column(String(128), index=True)
    backend: Mapped[str] = mapped_column(String(128))
    backend_version: Mapped[str] = mapped_column(String(64), default="")
    host: Mapped[str] = mapped_column(String(256), default="")
    git_commit: Mapped[str] = mapped_column(String(64), default="")
    command: Mapped[str] = mapped_column(Text, default="")
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    status: Mapped[str] = mapped_column(String(32), default="running")
    sweep_digest: Mapped[str] = mapped_column(String(64), default="", index=True)
    source: Mapped[str] = mapped_column(Text, default="")
    # The sampled plan (JSON) and run settings, so an interrupted run resumes exactly.
    plan_json: Mapped[str] = mapped_column(Text, default="")
    settings_json: Mapped[str] = mapped_column(Text, default="{}")


class Measurement(Base):
    """One timed kernel-shaped work item of a run (latency in ms, power, clock)."""
    __tablename__ = "measurements"
    __table_args__ = (
        UniqueConstraint(
            "run_id", "device", "backend", "kernel", "op", "dtype", "dims", "seq",
            name="uq_measurements_key",
        ),
        Index("ix_measurements_device_kernel", "device", "kernel"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("benchmark_runs.id", ondelete="CASCADE"))
    device: Mapped[str] = mapped_column(String(128))
    backend: Mapped[str] = mapped_column(String(128))
    kernel: Mapped[str] = mapped_column(String(32))
    op: Mapped[str] = mapped_column(String(64))
    dtype: Mapped[str] = mapped_column(String(16))
    dims: Mapped[str] = mapped_column(String(1024))
    # Occurrence index of an identical key within one run: sources that repeat a shape keep
    # every repeat as its own row and re-import stays idempotent.
    seq: Mapped[int] = mapped_column(Integer, default=0)
    feature_schema_version: Mapped[int] = mapped_column(Integer, default=1)
    latency_ms: Mapped[float] = mapped_column(Float)
    latency_std_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    latency_min_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    repeats: Mapped[int] = mapped_column(Integer, default=0)
    power_watts: Mapped[float | None] = mapped_column(Float, nullable=True)
    energy_mj: Mapped[float | None] = mapped_column(Float, nullable=True)
    source: Mapped[str] = mapped_column(Text, default="")
    # Added in revision 0002: throttling shows up as a lower clock than the board's maximum.
    sm_clock_mhz: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Added in revision 0003: forward+backward with autograd (`gpuplan bench --backend torch`).
    fwd_bwd_latency_ms: Mapped[float | None] = mapped_column(Float, nullable=True)


class ModelVersion(Base):
    """A fitted latency-model bundle: training-data digest, metrics and bundle path."""
    __tablename__ = "model_versions"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    data_digest: Mapped[str] = mapped_column(String(128))
    metrics_json: Mapped[str] = mapped_column(Text, default="{}")
    bundle_path: Mapped[str] = mapped_column(Text, default="")


class JobOutcomeRecord(Base):
    """A finished training job's estimated vs actual seconds, reported for calibration; one row
    per job uid."""
    __tablename__ = "job_outcomes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # Unique since revision 0004: a job reports once, and a repeated report must not count twice
    # in the calibration (the store answers it with the first row's id).
    job_uid: Mapped[str] = mapped_column(String(128), index=True, unique=True)
    device: Mapped[str] = mapped_column(String(128))
    gpu_count: Mapped[int] = mapped_column(Integer)
    estimated_seconds: Mapped[float] = mapped_column(Float)
    actual_seconds: Mapped[float] = mapped_column(Float)
    model_digest: Mapped[str] = mapped_column(String(128), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # Added in revision 0005, for fitting multi-GPU scaling (`parallel.scaling`); NULL from
    # operators that predate it. The parts are the model's own (uncalibrated) per-step ms at
    # `per_gpu_batch`; `steps` is how many optimizer steps the job ran.
    gpus_per_node: Mapped[int | None] = mapped_column(Integer, nullable=True)
    nodes: Mapped[int | None] = mapped_column(Integer, nullable=True)
    per_gpu_batch: Mapped[int | None] = mapped_column(Integer, nullable=True)
    steps: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    forward_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    backward_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    optimizer_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    gradient_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    intra_node_gbps: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Added in revision 0007: the plan's workload (`plan_workloads`), so the promotion gate can
    # re-estimate the job with another bundle; NULL from operators that predate it.
    workload_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    # Added in revision 0009: the TrainingJob's namespace, whose share of the calibration is
    # bounded (issue #33); "" for rows that predate it.
    namespace: Mapped[str] = mapped_column(String(63), default="", server_default="")


BUNDLE_STATES = ("candidate", "active", "retired")
"""A bundle's life: stored as a candidate, served while active (at most one), retired when
another is activated; a retired or candidate bundle can be activated again (rollback)."""


class ModelBundle(Base):
    """A model bundle stored whole (revision 0006): its bytes, provenance, metrics and state."""
    __tablename__ = "model_bundles"
    __table_args__ = (
        CheckConstraint("state IN ('candidate', 'active', 'retired')",
                        name="ck_model_bundles_state"),
        Index("uq_model_bundles_one_active", "state", unique=True,
              sqlite_where=text("state = 'active'"), postgresql_where=text("state = 'active'")),
        {"sqlite_autoincrement": True},
    )

    version: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    # A gzip-compressed tar of the bundle directory (`latency.bundles.pack_bundle`).
    bundle_bytes: Mapped[bytes] = mapped_column(LargeBinary)
    bundle_sha256: Mapped[str] = mapped_column(String(64))
    size_bytes: Mapped[int] = mapped_column(Integer)
    data_digest: Mapped[str] = mapped_column(String(128), server_default="")
    rows: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    git_commit: Mapped[str] = mapped_column(String(64), server_default="")
    metrics_json: Mapped[str] = mapped_column(Text, server_default="{}")
    state: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(Text, server_default="")
    state_changed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class PlanWorkload(Base):
    """What a plan's chosen candidate runs, as the predictor sees it (revision 0007): the
    zstd-compressed JSON of `planning.workloads`, keyed by its SHA-256."""
    __tablename__ = "plan_workloads"

    workload_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    device: Mapped[str] = mapped_column(String(128))
    gpu_count: Mapped[int] = mapped_column(Integer)
    size_bytes: Mapped[int] = mapped_column(Integer)
    workload_zstd: Mapped[bytes] = mapped_column(LargeBinary)


class HostProbeRecord(Base):
    """One host probe of a node (revision 0008): `bench.host_probe`'s figures in microseconds,
    keyed by node type (GPU device key and CPU model), with where they were measured."""
    __tablename__ = "host_probes"
    __table_args__ = (
        Index("ix_host_probes_device", "device", "probe_version"),
        Index("ix_host_probes_node_type", "node_type", "probe_version"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    # SHA-256 of device, figures and provenance: the same probe imported twice is stored once.
    digest: Mapped[str] = mapped_column(String(64), unique=True)
    node_type: Mapped[str] = mapped_column(String(400))
    device: Mapped[str] = mapped_column(String(128))
    cpu_model: Mapped[str] = mapped_column(String(256))
    probe_version: Mapped[int] = mapped_column(Integer)
    figures_json: Mapped[str] = mapped_column(Text)
    provenance_json: Mapped[str] = mapped_column(Text)
    # The benchmark run measured with it; no foreign key (the probe outlives a deleted run).
    run_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
