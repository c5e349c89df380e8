"""`PerfStore`: the one API over the performance database (SQLite file or PostgreSQL)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import Select, delete, func, insert, select, text, update
from sqlalchemy.engine import Engine

from gpuplan_estimator.core import errors, limits, paths, vocabulary
from gpuplan_estimator.core.measurements import MEASUREMENT_COLUMNS
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.perfdb import connections, frames
from gpuplan_estimator.perfdb.host_probes import (
    ProbeRow,
    StoredHostProbe,
    check_row,
    provenance_json,
)
from gpuplan_estimator.perfdb.tables import (
    BUNDLE_STATES,
    BenchmarkRun,
    Device,
    HostProbeRecord,
    JobOutcomeRecord,
    Measurement,
    ModelBundle,
    ModelVersion,
    PlanWorkload,
)

Clock = Callable[[], datetime]
RUN_STATUSES = frozenset({"running", "done", "failed", "interrupted"})
# Widths of the job_outcomes text columns and the range of its INTEGER column (PostgreSQL's
# int4), checked before writing so an oversized value is a named field error, not a DataError.
MAX_KEY_CHARS = 128
MAX_GPU_COUNT = 2**31 - 1
MAX_BIGINT = 2**63 - 1
"""Range of the job_outcomes BIGINT columns (steps, gradient_bytes)."""
SCALING_INT_FIELDS = {"gpus_per_node": (1, MAX_GPU_COUNT), "nodes": (1, MAX_GPU_COUNT),
                      "per_gpu_batch": (1, MAX_GPU_COUNT), "steps": (1, MAX_BIGINT),
                      "gradient_bytes": (0, MAX_BIGINT)}
SCALING_MS_FIELDS = ("forward_ms", "backward_ms", "optimizer_ms")
"""Optional job outcome fields for the scaling fit (revision 0005): ranges, and the per-step
parts in ms (finite, >= 0); `intra_node_gbps` must be finite and positive."""


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes for timezone-aware columns; they were written in UTC."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=UTC)


@dataclass(frozen=True)
class RunInfo:
    """A benchmark run as read back from the database."""
    id: int
    device: str
    backend: str
    status: str
    sweep_digest: str
    source: str
    plan_json: str
    settings_json: str
    started_at: datetime
    ended_at: datetime | None
    backend_version: str
    host: str
    git_commit: str
    command: str


@dataclass(frozen=True)
class StoredOutcome:
    """The row a job outcome is stored in; `created` is False when the job uid was already
    recorded, in which case `id` is the earlier row's and nothing was written."""
    id: int
    created: bool


class UnknownBundleError(errors.GpuplanError, LookupError):
    """No model bundle has the requested version (a LookupError too, so callers that do not
    import the database layer, such as the HTTP service, can answer 404)."""

    def __init__(self, version: int, where: str) -> None:
        self.version = version
        super().__init__(f"no model bundle version {version} in {where}")


@dataclass(frozen=True)
class StoredBundle:
    """A model bundle as stored (without its bytes): version, provenance, metrics, state."""
    version: int
    created_at: datetime
    state: str
    reason: str
    state_changed_at: datetime
    size_bytes: int
    bundle_sha256: str
    data_digest: str
    rows: int | None
    git_commit: str
    metrics: dict[str, Any]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready: times as ISO 8601."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["created_at"] = self.created_at.isoformat()
        out["state_changed_at"] = self.state_changed_at.isoformat()
        return out


@dataclass(frozen=True)
class OutcomeWorkload:
    """A finished job's outcome and the stored workload of the plan it ran."""
    job_uid: str
    actual_seconds: float
    estimated_seconds: float
    """The model's own (uncalibrated) estimate, as stored with the outcome."""
    workload_id: str
    workload_zstd: bytes


_BUNDLE_INFO_COLUMNS = tuple(c for c in ModelBundle.__table__.columns if c.name != "bundle_bytes")
MAX_REASON_CHARS = 4000


class PerfStore:
    """Devices, benchmark runs, measurements, model versions and job outcomes.

    Open with `PerfStore.open(url)`; migrations are applied on open. Every write retries a
    locked or unreachable database with backoff, then raises `errors.DatabaseError`.
    """

    def __init__(
        self, engine: Engine, *, retries: int, retry_delay_seconds: float, clock: Clock = _utcnow
    ) -> None:
        self.engine = engine
        self.retries = retries
        self.retry_delay_seconds = retry_delay_seconds
        self.clock = clock

    @classmethod
    def open(
        cls,
        url: str | None = None,
        *,
        retries: int = 5,
        retry_delay_seconds: float = 0.5,
        busy_timeout_seconds: float = connections.SQLITE_BUSY_TIMEOUT_SECONDS,
        clock: Clock = _utcnow,
    ) -> PerfStore:
        """Connect to `url` (default `paths.default_db_url()`) and upgrade the schema to head.

        `busy_timeout_seconds` is how long SQLite waits on a lock before a retry counts.
        """
        eng = connections.create(
            url or paths.default_db_url(), busy_timeout_seconds=busy_timeout_seconds
        )
        store = cls(eng, retries=retries, retry_delay_seconds=retry_delay_seconds, clock=clock)
        store._retry(lambda: connections.upgrade(eng))
        return store

    @property
    def url(self) -> str:
        """The database URL with any password masked."""
        return connections.masked(self.engine.url)

    def close(self) -> None:
        """Dispose of the engine's connection pool."""
        self.engine.dispose()

    def __enter__(self) -> PerfStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _retry(self, fn: Callable[[], Any]) -> Any:
        return connections.with_retry(
            fn, url=self.engine.url, retries=self.retries,
            retry_delay_seconds=self.retry_delay_seconds,
        )

    # -- runs -------------------------------------------------------------------------------

    def add_run(
        self,
        *,
        device: str,
        backend: str,
        backend_version: str = "",
        host: str = "",
        git_commit: str = "",
        command: str = "",
        sweep_digest: str = "",
        source: str = "",
        plan_json: str = "",
        settings: Mapping[str, Any] | None = None,
    ) -> int:
        """Record a run in status ``running``; returns its id."""
        row = {
            "device": device,
            "backend": backend,
            "backend_version": backend_version,
            "host": host,
            "git_commit": git_commit,
            "command": command,
            "started_at": self.clock(),
            "ended_at": None,
            "status": "running",
            "sweep_digest": sweep_digest,
            "source": source,
            "plan_json": plan_json,
            "settings_json": json.dumps(dict(settings or {}), sort_keys=True),
        }

        def _do() -> int:
            with self.engine.begin() as conn:
                result = conn.execute(insert(BenchmarkRun).values(**row))
                return int(result.inserted_primary_key[0])  # type: ignore[index]

        return int(self._retry(_do))

    def finish_run(self, run_id: int, status: str) -> None:
        """Set a run's final status (one of RUN_STATUSES) and its end time."""
        if status not in RUN_STATUSES:
            raise errors.InvalidRequestError("status", f"{status!r} not in {sorted(RUN_STATUSES)}")
        stmt = (
            update(BenchmarkRun)
            .where(BenchmarkRun.id == run_id)
            .values(status=status, ended_at=self.clock())
        )

        def _do() -> None:
            with self.engine.begin() as conn:
                if conn.execute(stmt).rowcount != 1:
                    raise errors.DatabaseError(f"no benchmark run with id {run_id}")

        self._retry(_do)

    def runs(
        self, *, device: str | None = None, sweep_digest: str | None = None,
        source: str | None = None,
    ) -> list[RunInfo]:
        """Runs, oldest first, filtered by any of the given fields."""
        stmt: Select[Any] = select(BenchmarkRun.__table__).order_by(BenchmarkRun.id)
        if device is not None:
            stmt = stmt.where(BenchmarkRun.device == device)
        if sweep_digest is not None:
            stmt = stmt.where(BenchmarkRun.sweep_digest == sweep_digest)
        if source is not None:
            stmt = stmt.where(BenchmarkRun.source == source)

        def _do() -> list[RunInfo]:
            with self.engine.connect() as conn:
                rows = conn.execute(stmt).mappings().all()
            return [RunInfo(**{f: r[f] for f in RunInfo.__dataclass_fields__}) for r in rows]

        return list(self._retry(_do))

    # -- measurements -----------------------------------------------------------------------

    def add_measurements(self, run_id: int, frame: pd.DataFrame) -> int:
        """Insert the rows of a measurement frame not already stored for this run.

        Idempotent: the key is (device, backend, kernel, op, dtype, dims) plus the occurrence
        index of that key in `frame`, so re-adding the same frame adds nothing, also when two
        writers add it at the same time (the database skips rows whose key exists). Returns the
        rows this call actually inserted.
        """
        rows = frames.prepare_rows(run_id, frame)
        if rows.empty:
            return 0
        existing = self._existing_keys(run_id)
        if not existing.empty:
            key = [*frames.KEY_COLUMNS, "seq"]
            merged = rows.merge(existing, on=key, how="left", indicator=True)
            rows = merged[merged["_merge"] == "left_only"].drop(columns="_merge")
        if rows.empty:
            return 0
        records = frames.to_records(rows)
        # The key check above saves sending rows that are stored; the ON CONFLICT covers a
        # concurrent writer that stores them between that check and this insert.
        stmt = connections.insert_ignoring_duplicates(self.engine, Measurement).returning(
            Measurement.id
        )

        def _do() -> int:
            with self.engine.begin() as conn:
                return len(conn.execute(stmt, records).all())

        return int(self._retry(_do))

    def _existing_keys(self, run_id: int) -> pd.DataFrame:
        cols = [getattr(Measurement, c) for c in (*frames.KEY_COLUMNS, "seq")]
        stmt = select(*cols).where(Measurement.run_id == run_id)

        def _do() -> pd.DataFrame:
            with self.engine.connect() as conn:
                data = conn.execute(stmt).all()
            return pd.DataFrame(data, columns=[*frames.KEY_COLUMNS, "seq"])

        frame: pd.DataFrame = self._retry(_do)
        return frame

    def measurements(
        self,
        *,
        devices: Iterable[str] | None = None,
        kernels: Iterable[str] | None = None,
        backend: str | None = None,
        run_id: int | None = None,
    ) -> pd.DataFrame:
        """Stored rows as a measurement frame (`MEASUREMENT_COLUMNS` + `EXTRA_COLUMNS`)."""
        cols = [getattr(Measurement, c) for c in (*MEASUREMENT_COLUMNS, *frames.EXTRA_COLUMNS)]
        stmt = select(*cols).order_by(Measurement.id)
        if devices is not None:
            stmt = stmt.where(Measurement.device.in_(list(devices)))
        if kernels is not None:
            stmt = stmt.where(Measurement.kernel.in_(list(kernels)))
        if backend is not None:
            stmt = stmt.where(Measurement.backend == backend)
        if run_id is not None:
            stmt = stmt.where(Measurement.run_id == run_id)

        def _do() -> pd.DataFrame:
            with self.engine.connect() as conn:
                data = conn.execute(stmt).all()
            return pd.DataFrame(data, columns=[*MEASUREMENT_COLUMNS, *frames.EXTRA_COLUMNS])

        frame: pd.DataFrame = self._retry(_do)
        for col in ("latency_ms", "latency_std_ms", *frames.OPTIONAL_COLUMNS):
            frame[col] = frame[col].astype("float64")
        frame["repeats"] = frame["repeats"].astype("int64")
        return frame

    def coverage(self) -> dict[str, tuple[int, datetime | None]]:
        """Per device: (measurement rows, end time of its newest finished run or None).

        A device with runs but no rows appears with 0 rows; only ``done`` runs count as fresh
        data, so a failed or interrupted benchmark does not reset the age.
        """
        rows_stmt = select(Measurement.device, func.count()).group_by(Measurement.device)
        runs_stmt = (
            select(BenchmarkRun.device, func.max(BenchmarkRun.ended_at))
            .where(BenchmarkRun.status == "done")
            .group_by(BenchmarkRun.device)
        )

        def _do() -> dict[str, tuple[int, datetime | None]]:
            with self.engine.connect() as conn:
                counts = {str(d): int(n) for d, n in conn.execute(rows_stmt).all()}
                newest = {str(d): _aware(t) for d, t in conn.execute(runs_stmt).all()}
            return {d: (counts.get(d, 0), newest.get(d)) for d in sorted({*counts, *newest})}

        return dict(self._retry(_do))

    def delete_run(self, run_id: int) -> None:
        """Delete a run and all of its measurements."""
        def _do() -> None:
            with self.engine.begin() as conn:
                conn.execute(delete(Measurement).where(Measurement.run_id == run_id))
                conn.execute(delete(BenchmarkRun).where(BenchmarkRun.id == run_id))

        self._retry(_do)

    # -- devices, model versions, job outcomes ---------------------------------------------

    def upsert_device(self, spec: DeviceSpec, *, nvml_name: str = "", nvml_uuid: str = "") -> None:
        """Insert or refresh a device; `first_seen` is kept, `last_seen` moves to now."""
        now = self.clock()
        values = {
            "name": spec.name,
            "vendor": spec.vendor,
            "nvml_name": nvml_name,
            "nvml_uuid": nvml_uuid,
            "spec_json": json.dumps(
                {f.name: getattr(spec, f.name) for f in fields(spec)},
                sort_keys=True, default=frames.jsonable,
            ),
            "last_seen": now,
        }

        # One statement, so two benchmarks of the same device type starting together do not
        # both find it missing and both insert it.
        stmt = connections.upsert(
            self.engine, Device, index_elements=["key"],
            values={"key": spec.key, "first_seen": now, **values}, update=values,
        )

        def _do() -> None:
            with self.engine.begin() as conn:
                conn.execute(stmt)

        self._retry(_do)

    def devices(self) -> pd.DataFrame:
        """The devices table as a frame, ordered by key."""
        stmt = select(Device.__table__).order_by(Device.key)

        def _do() -> pd.DataFrame:
            with self.engine.connect() as conn:
                result = conn.execute(stmt)
                return pd.DataFrame(result.all(), columns=list(result.keys()))

        frame: pd.DataFrame = self._retry(_do)
        return frame

    def record_model_version(
        self, *, data_digest: str, metrics: Mapping[str, Any], bundle_path: str
    ) -> int:
        """Record a fitted bundle with its data digest and metrics; returns its id."""
        row = {
            "created_at": self.clock(),
            "data_digest": data_digest,
            "metrics_json": json.dumps(dict(metrics), sort_keys=True, default=frames.jsonable),
            "bundle_path": bundle_path,
        }
        return self._insert(ModelVersion, row)

    def model_versions(self) -> pd.DataFrame:
        """The model_versions table as a frame, oldest first."""
        return self._frame(select(ModelVersion.__table__).order_by(ModelVersion.id))

    def record_job_outcome(
        self,
        *,
        job_uid: str,
        device: str,
        gpu_count: int,
        estimated_seconds: float,
        actual_seconds: float,
        model_digest: str = "",
        gpus_per_node: int | None = None,
        nodes: int | None = None,
        per_gpu_batch: int | None = None,
        steps: int | None = None,
        forward_ms: float | None = None,
        backward_ms: float | None = None,
        optimizer_ms: float | None = None,
        gradient_bytes: int | None = None,
        intra_node_gbps: float | None = None,
        workload_id: str | None = None,
        namespace: str = "",
    ) -> StoredOutcome:
        """Record one finished job's estimated and actual seconds, once per `job_uid`.

        The optional fields are what a multi-GPU scaling fit needs (`parallel.scaling`): the
        node shape, the per-GPU batch, the optimizer steps run, and the model's own
        (uncalibrated) per-step forward, backward and optimizer ms, gradient bytes and
        intra-node GB/s of the plan; None is stored as NULL (older operators send none).
        `workload_id` names the plan's stored workload (`add_workload`, revision 0007), which
        the promotion gate re-estimates; it need not exist (yet): the gate joins on it.
        `namespace` is the TrainingJob's (revision 0009), "" when not known: the calibration
        bounds each namespace's weight (`planning.calibrating.namespace_weights`).

        A job uid already stored writes nothing and returns that row (``created=False``), so a
        retried or replayed report never counts twice in the calibration. `estimated_seconds`
        is the model's UNcalibrated estimate (the service divides the plan's calibrated one by
        the factor the plan used), so the calibration fitted from these rows never corrects its
        own earlier corrections. Bad values raise `InvalidRequestError` naming the field; a
        failing database raises `DatabaseError`.
        """
        _check_text("job_uid", job_uid, required=True)
        _check_text("device", device, required=True)
        _check_text("model_digest", model_digest, required=False)
        _check_gpu_count(gpu_count)
        _check_seconds("estimated_seconds", estimated_seconds)
        _check_seconds("actual_seconds", actual_seconds)
        scaling: dict[str, int | float | None] = {
            "gpus_per_node": gpus_per_node, "nodes": nodes, "per_gpu_batch": per_gpu_batch,
            "steps": steps, "gradient_bytes": gradient_bytes, "forward_ms": forward_ms,
            "backward_ms": backward_ms, "optimizer_ms": optimizer_ms,
            "intra_node_gbps": intra_node_gbps}
        _check_scaling(scaling)
        if workload_id is not None:
            vocabulary.check_workload_id(workload_id)
        vocabulary.check_namespace(namespace)
        row = {
            "job_uid": job_uid,
            "device": device,
            "gpu_count": gpu_count,
            "estimated_seconds": float(estimated_seconds),
            "actual_seconds": float(actual_seconds),
            "model_digest": model_digest,
            "created_at": self.clock(),
            **scaling,
            "workload_id": workload_id,
            "namespace": namespace,
        }
        stmt = connections.insert_ignoring_duplicates(
            self.engine, JobOutcomeRecord, index_elements=["job_uid"]
        ).values(**row).returning(JobOutcomeRecord.id)
        existing = select(JobOutcomeRecord.id).where(JobOutcomeRecord.job_uid == job_uid)

        def _do() -> StoredOutcome:
            with self.engine.begin() as conn:
                new_id = conn.execute(stmt).scalar_one_or_none()
                if new_id is not None:
                    return StoredOutcome(id=int(new_id), created=True)
                # The conflicting row is committed by now: the insert waited for it.
                return StoredOutcome(id=int(conn.execute(existing).scalar_one()), created=False)

        stored: StoredOutcome = self._retry(_do)
        return stored

    def job_outcomes(
        self, *, device: str | None = None, job_uid: str | None = None,
        after_id: int | None = None,
    ) -> pd.DataFrame:
        """Finished jobs, oldest first; `drift_ratio` is actual / the model's own estimate.
        `after_id`: only rows whose id is larger (those added since a read)."""
        stmt: Select[Any] = select(JobOutcomeRecord.__table__).order_by(JobOutcomeRecord.id)
        if after_id is not None:
            stmt = stmt.where(JobOutcomeRecord.id > after_id)
        if device is not None:
            stmt = stmt.where(JobOutcomeRecord.device == device)
        if job_uid is not None:
            stmt = stmt.where(JobOutcomeRecord.job_uid == job_uid)
        frame = self._frame(stmt)
        if frame.empty:
            return pd.DataFrame(columns=[c.name for c in JobOutcomeRecord.__table__.columns])
        frame["drift_ratio"] = frame["actual_seconds"] / frame["estimated_seconds"]
        return frame

    def job_outcome_count(self) -> int:
        """How many job outcomes are stored (one indexed count, no rows read)."""
        stmt = select(func.count()).select_from(JobOutcomeRecord)

        def _do() -> int:
            with self.engine.connect() as conn:
                return int(conn.execute(stmt).scalar_one())

        return int(self._retry(_do))

    # -- plan workloads (revision 0007) -----------------------------------------------------

    def add_workload(self, workload_id: str, data: bytes, *, device: str, gpu_count: int
                     ) -> bool:
        """Store a plan's compressed workload under its id (`planning.workloads.encode`) once;
        True when this call stored it, False when the id was already there."""
        vocabulary.check_workload_id(workload_id)
        _check_text("device", device, required=True)
        if len(data) > limits.MAX_WORKLOAD_BYTES:
            raise errors.InvalidRequestError(
                "workload",
                f"must be at most {limits.MAX_WORKLOAD_BYTES} bytes, got {len(data)}")
        row = {"workload_id": workload_id, "created_at": self.clock(), "device": device,
               "gpu_count": int(gpu_count), "size_bytes": len(data), "workload_zstd": data}
        stmt = connections.insert_ignoring_duplicates(
            self.engine, PlanWorkload, index_elements=["workload_id"]
        ).values(**row).returning(PlanWorkload.workload_id)

        def _do() -> bool:
            with self.engine.begin() as conn:
                return conn.execute(stmt).scalar_one_or_none() is not None

        return bool(self._retry(_do))

    def prune_workloads(self, *, older_than: datetime) -> int:
        """Delete the plan workloads stored before `older_than` that no job outcome names, and
        return how many went. Every plan stores one (content-addressed, up to 2 MiB), so
        without this the table grows with every distinct plan; a workload an outcome names
        stays, since the promotion gate re-estimates it with each new bundle."""
        named = select(JobOutcomeRecord.workload_id).where(
            JobOutcomeRecord.workload_id.is_not(None))
        stmt = delete(PlanWorkload).where(PlanWorkload.created_at < older_than,
                                          PlanWorkload.workload_id.not_in(named))

        def _do() -> int:
            with self.engine.begin() as conn:
                return int(conn.execute(stmt).rowcount or 0)

        return int(self._retry(_do))

    def outcome_workloads(self, *, limit: int) -> list[OutcomeWorkload]:
        """The newest `limit` job outcomes whose plan's workload is stored, newest first."""
        stmt = (select(JobOutcomeRecord.job_uid, JobOutcomeRecord.actual_seconds,
                       JobOutcomeRecord.estimated_seconds, PlanWorkload.workload_id,
                       PlanWorkload.workload_zstd)
                .join(PlanWorkload, PlanWorkload.workload_id == JobOutcomeRecord.workload_id)
                .order_by(JobOutcomeRecord.id.desc()).limit(limit))

        def _do() -> list[OutcomeWorkload]:
            with self.engine.connect() as conn:
                return [OutcomeWorkload(str(r[0]), float(r[1]), float(r[2]), str(r[3]),
                                        bytes(r[4])) for r in conn.execute(stmt).all()]

        return list(self._retry(_do))

    def outcome_counts(self) -> tuple[int, int]:
        """(job outcomes, those naming a workload id), for saying why none could be scored."""
        stmt = select(func.count(), func.count(JobOutcomeRecord.workload_id))

        def _do() -> tuple[int, int]:
            with self.engine.connect() as conn:
                total, linked = conn.execute(stmt.select_from(JobOutcomeRecord)).one()
            return int(total), int(linked)

        counts: tuple[int, int] = self._retry(_do)
        return counts

    # -- host probes (revision 0008) -------------------------------------------------------

    def add_host_probe(self, row: ProbeRow, *, run_id: int | None = None) -> bool:
        """Store one host probe of a node type (`host_probes.ProbeRow`), measured with the
        benchmark run `run_id` if any; True when this call stored it, False when the same
        probe (same digest) was already there. Bad fields raise `InvalidRequestError`."""
        check_row(row)
        values = {
            "digest": row.digest(), "node_type": row.node_type, "device": row.device,
            "cpu_model": row.cpu_model, "probe_version": row.probe_version,
            "figures_json": json.dumps(dict(row.figures_us), sort_keys=True),
            "provenance_json": provenance_json(row.provenance), "run_id": run_id,
            "created_at": self.clock(),
        }
        stmt = connections.insert_ignoring_duplicates(
            self.engine, HostProbeRecord, index_elements=["digest"]
        ).values(**values).returning(HostProbeRecord.id)

        def _do() -> bool:
            with self.engine.begin() as conn:
                return conn.execute(stmt).scalar_one_or_none() is not None

        return bool(self._retry(_do))

    def host_probes(self, *, device: str | None = None) -> list[StoredHostProbe]:
        """Every stored probe (of `device` when given), oldest first."""
        stmt: Select[Any] = select(HostProbeRecord.__table__).order_by(HostProbeRecord.id)
        if device is not None:
            stmt = stmt.where(HostProbeRecord.device == device)
        return self._probes(stmt)

    def latest_host_probes(self, *, per: str, probe_version: int
                           ) -> dict[str, StoredHostProbe]:
        """The newest probe of `probe_version` per ``"device"`` key or per ``"node_type"``
        (GPU key and CPU model), keyed by it."""
        if per not in ("device", "node_type"):
            raise errors.InvalidRequestError("per", f"must be 'device' or 'node_type', "
                                             f"got {per!r}")
        key = getattr(HostProbeRecord, per)
        newest = (select(func.max(HostProbeRecord.id))
                  .where(HostProbeRecord.probe_version == probe_version).group_by(key))
        stmt = (select(HostProbeRecord.__table__).where(HostProbeRecord.id.in_(newest))
                .order_by(HostProbeRecord.id))
        return {getattr(p, per): p for p in self._probes(stmt)}

    def _probes(self, stmt: Select[Any]) -> list[StoredHostProbe]:
        def _do() -> list[StoredHostProbe]:
            with self.engine.connect() as conn:
                return [StoredHostProbe(
                    id=int(r["id"]), node_type=str(r["node_type"]), device=str(r["device"]),
                    cpu_model=str(r["cpu_model"]), probe_version=int(r["probe_version"]),
                    figures_us={str(k): float(v)
                                for k, v in json.loads(r["figures_json"]).items()},
                    provenance=json.loads(r["provenance_json"]),
                    run_id=None if r["run_id"] is None else int(r["run_id"]),
                    created_at=_aware(r["created_at"]) or r["created_at"],
                ) for r in conn.execute(stmt).mappings().all()]

        return list(self._retry(_do))

    # -- model bundles (revision 0006) -----------------------------------------------------

    def add_bundle(
        self, bundle: Path | bytes, *, state: str = "candidate", reason: str = ""
    ) -> int:
        """Store a bundle (its directory, or the bytes of `bundles.pack_bundle`); returns its
        version. With ``state="active"`` it is activated in the same transaction (the
        active one before it is retired). The manifest's ``data_digest``, ``rows``, ``commit``
        and ``metrics`` are stored beside the bytes."""
        from gpuplan_estimator.latency import bundles  # LightGBM: only for bundle writers

        if state not in BUNDLE_STATES or state == "retired":
            raise errors.InvalidRequestError(
                "state", f"a new bundle is 'candidate' or 'active', not {state!r}")
        _check_reason(reason)
        data = bundles.pack_bundle(bundle) if isinstance(bundle, Path) else bytes(bundle)
        manifest = bundles.packed_manifest(data)
        rows = manifest.get("rows")
        now = self.clock()
        row = {
            "created_at": now, "bundle_bytes": data,
            "bundle_sha256": bundles.packed_digest(data), "size_bytes": len(data),
            "data_digest": str(manifest.get("data_digest", ""))[:128],
            "rows": int(rows) if isinstance(rows, int) and not isinstance(rows, bool) else None,
            "git_commit": str(manifest.get("commit", ""))[:64],
            "metrics_json": json.dumps(manifest.get("metrics", {}), sort_keys=True,
                                       default=frames.jsonable),
            "state": "candidate", "reason": reason, "state_changed_at": now,
        }

        def _do() -> int:
            with self.engine.begin() as conn:
                if state == "active":
                    self._lock_bundles(conn)
                result = conn.execute(insert(ModelBundle).values(**row))
                version = int(result.inserted_primary_key[0])  # type: ignore[index]
                if state == "active":
                    self._activate_in(conn, version, reason, now)
                return version

        return int(self._retry(_do))

    def bundles(self) -> list[StoredBundle]:
        """Every stored bundle without its bytes, oldest version first."""
        stmt = select(*_BUNDLE_INFO_COLUMNS).order_by(ModelBundle.version)

        def _do() -> list[StoredBundle]:
            with self.engine.connect() as conn:
                return [_stored_bundle(r) for r in conn.execute(stmt).mappings().all()]

        return list(self._retry(_do))

    def bundle(self, version: int) -> tuple[StoredBundle, bytes]:
        """One bundle and its bytes; `UnknownBundleError` naming the version when absent."""
        stmt = select(ModelBundle.__table__).where(ModelBundle.version == version)

        def _do() -> Any:
            with self.engine.connect() as conn:
                return conn.execute(stmt).mappings().one_or_none()

        found = self._retry(_do)
        if found is None:
            raise UnknownBundleError(version, self.url)
        return _stored_bundle(found), bytes(found["bundle_bytes"])

    def active_bundle(self) -> tuple[int, bytes] | None:
        """(version, bytes) of the active bundle, or None when no bundle is active."""
        stmt = (select(ModelBundle.version, ModelBundle.bundle_bytes)
                .where(ModelBundle.state == "active"))

        def _do() -> tuple[int, bytes] | None:
            with self.engine.connect() as conn:
                found = conn.execute(stmt).one_or_none()
            return None if found is None else (int(found[0]), bytes(found[1]))

        active: tuple[int, bytes] | None = self._retry(_do)
        return active

    def active_version(self) -> int | None:
        """The active bundle's version (a cheap query: no bytes), or None."""
        stmt = select(ModelBundle.version).where(ModelBundle.state == "active")

        def _do() -> int | None:
            with self.engine.connect() as conn:
                found = conn.execute(stmt).scalar_one_or_none()
            return None if found is None else int(found)

        version: int | None = self._retry(_do)
        return version

    def bundle_changed_since(self, version: int | None) -> bool:
        """Whether the active bundle is no longer `version` (None: there was none active)."""
        return self.active_version() != version

    def activate(self, version: int, reason: str = "") -> int:
        """Make `version` the active bundle and retire the one active before, in one
        transaction (activating a retired or candidate version is the rollback). Returns the
        version; `UnknownBundleError` naming it when it does not exist."""
        _check_reason(reason)

        def _do() -> int:
            with self.engine.begin() as conn:
                self._lock_bundles(conn)
                self._activate_in(conn, version, reason, self.clock())
            return version

        return int(self._retry(_do))

    def set_bundle_reason(self, version: int, reason: str) -> None:
        """Replace the stored `reason` of `version` without changing its state (a refused
        candidate keeps the gate's verdict, shown by `gpuplan models list|show`);
        `UnknownBundleError` naming it when it does not exist."""
        _check_reason(reason)
        stmt = update(ModelBundle).where(ModelBundle.version == version).values(reason=reason)

        def _do() -> int:
            with self.engine.begin() as conn:
                return int(conn.execute(stmt).rowcount)

        if self._retry(_do) == 0:
            raise UnknownBundleError(version, self.url)

    def _lock_bundles(self, conn: Any) -> None:
        """Serialise activations: on PostgreSQL two concurrent ones would each retire the old
        active row and then both set theirs active (the unique index would refuse the second);
        SQLite already takes its write lock at the first UPDATE."""
        if self.engine.dialect.name == "postgresql":
            conn.execute(text("LOCK TABLE model_bundles IN SHARE ROW EXCLUSIVE MODE"))

    def _activate_in(self, conn: Any, version: int, reason: str, now: datetime) -> None:
        exists = conn.execute(
            select(ModelBundle.version).where(ModelBundle.version == version)
        ).scalar_one_or_none()
        if exists is None:
            raise UnknownBundleError(version, self.url)
        # Retire first: the partial unique index allows one active row at any moment.
        conn.execute(update(ModelBundle)
                     .where(ModelBundle.state == "active", ModelBundle.version != version)
                     .values(state="retired", state_changed_at=now,
                             reason=f"replaced by version {version}"))
        conn.execute(update(ModelBundle).where(ModelBundle.version == version)
                     .values(state="active", state_changed_at=now, reason=reason))

    def _insert(self, table: type[Any], row: Mapping[str, Any]) -> int:
        def _do() -> int:
            with self.engine.begin() as conn:
                result = conn.execute(insert(table).values(**row))
                return int(result.inserted_primary_key[0])  # type: ignore[index]

        return int(self._retry(_do))

    def _frame(self, stmt: Select[Any]) -> pd.DataFrame:
        def _do() -> pd.DataFrame:
            with self.engine.connect() as conn:
                result = conn.execute(stmt)
                return pd.DataFrame(result.all(), columns=list(result.keys()))

        frame: pd.DataFrame = self._retry(_do)
        return frame


def _stored_bundle(row: Any) -> StoredBundle:
    return StoredBundle(
        version=int(row["version"]), created_at=_aware(row["created_at"]) or row["created_at"],
        state=str(row["state"]), reason=str(row["reason"]),
        state_changed_at=_aware(row["state_changed_at"]) or row["state_changed_at"],
        size_bytes=int(row["size_bytes"]), bundle_sha256=str(row["bundle_sha256"]),
        data_digest=str(row["data_digest"]),
        rows=None if row["rows"] is None else int(row["rows"]),
        git_commit=str(row["git_commit"]), metrics=json.loads(row["metrics_json"] or "{}"))


def _check_reason(reason: object) -> None:
    if not isinstance(reason, str):
        raise errors.InvalidRequestError("reason", f"must be a string, got {reason!r}")
    if len(reason) > MAX_REASON_CHARS:
        raise errors.InvalidRequestError(
            "reason", f"must be at most {MAX_REASON_CHARS} characters, got {len(reason)}")


def _check_text(name: str, value: object, *, required: bool) -> None:
    if not isinstance(value, str):
        raise errors.InvalidRequestError(name, f"must be a string, got {type(value).__name__}")
    if required and not value:
        raise errors.InvalidRequestError(name, "must not be empty")
    if len(value) > MAX_KEY_CHARS:
        raise errors.InvalidRequestError(
            name, f"must be at most {MAX_KEY_CHARS} characters, got {len(value)}"
        )


def _check_gpu_count(gpu_count: object) -> None:
    if isinstance(gpu_count, bool) or not isinstance(gpu_count, int):
        raise errors.InvalidRequestError("gpu_count", f"must be an integer, got {gpu_count!r}")
    if not 1 <= gpu_count <= MAX_GPU_COUNT:
        raise errors.InvalidRequestError(
            "gpu_count", f"must be in 1..{MAX_GPU_COUNT}, got {gpu_count}")


def _check_seconds(name: str, value: object) -> None:
    """Finite and positive: one infinite or NaN outcome would make every later refit fail."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise errors.InvalidRequestError(name, f"must be a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise errors.InvalidRequestError(name, f"must be finite and positive, got {value!r}")


def _check_scaling(values: Mapping[str, int | float | None]) -> None:
    """The optional scaling fields: integers in their column's range, finite non-negative ms,
    positive GB/s; None passes (NULL)."""
    for name, (low, high) in SCALING_INT_FIELDS.items():
        value = values[name]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.InvalidRequestError(name, f"must be an integer, got {value!r}")
        if not low <= value <= high:
            raise errors.InvalidRequestError(name, f"must be in {low}..{high}, got {value}")
    for name in (*SCALING_MS_FIELDS, "intra_node_gbps"):
        value = values[name]
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise errors.InvalidRequestError(name, f"must be a number, got {value!r}")
        positive = name == "intra_node_gbps"
        if not math.isfinite(value) or value < 0 or (positive and value == 0):
            kind = "positive" if positive else "non-negative"
            raise errors.InvalidRequestError(name, f"must be finite and {kind}, got {value!r}")
