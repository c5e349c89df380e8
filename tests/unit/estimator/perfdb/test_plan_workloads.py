"""Plan workloads in the performance database (revision 0007, issue #17): stored once per id,
linked from job outcomes by workload_id, read back newest outcome first for the promotion gate;
the migration keeps an older database's rows. The store contract runs on SQLite here and on a
real PostgreSQL server when its binaries exist (the server of `test_model_bundles_postgres`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from gpuplan_estimator.core import errors, limits
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.old_databases import database_at

from .test_model_bundles_postgres import pg_server, pg_url  # noqa: F401  (fixtures)

IDS = [f"{i:064x}" for i in range(1, 5)]


def contract_workloads_link_outcomes(store: PerfStore) -> None:
    """What the gate relies on, on any database."""
    assert store.outcome_counts() == (0, 0)
    assert store.add_workload(IDS[0], b"\x00zstd-one", device="t4", gpu_count=1) is True
    assert store.add_workload(IDS[0], b"\x00zstd-one", device="t4", gpu_count=1) is False
    assert store.add_workload(IDS[1], b"\x01" * 1000, device="a100-sxm4-80gb",
                              gpu_count=8) is True
    store.record_job_outcome(job_uid="old", device="t4", gpu_count=1, estimated_seconds=10.0,
                             actual_seconds=11.0)
    store.record_job_outcome(job_uid="a", device="t4", gpu_count=1, estimated_seconds=20.0,
                             actual_seconds=22.0, workload_id=IDS[0])
    store.record_job_outcome(job_uid="b", device="a100-sxm4-80gb", gpu_count=8,
                             estimated_seconds=30.0, actual_seconds=33.0, workload_id=IDS[1])
    # Linked to a workload this database never stored (another replica's failed write).
    store.record_job_outcome(job_uid="c", device="t4", gpu_count=1, estimated_seconds=5.0,
                             actual_seconds=6.0, workload_id=IDS[2])
    assert store.outcome_counts() == (4, 3)
    rows = store.outcome_workloads(limit=10)
    assert [(r.job_uid, r.actual_seconds, r.estimated_seconds, r.workload_id)
            for r in rows] == [("b", 33.0, 30.0, IDS[1]), ("a", 22.0, 20.0, IDS[0])]
    assert rows[0].workload_zstd == b"\x01" * 1000 and rows[1].workload_zstd == b"\x00zstd-one"
    assert [r.job_uid for r in store.outcome_workloads(limit=1)] == ["b"]
    assert store.job_outcomes(job_uid="a")["workload_id"].tolist() == [IDS[0]]


def contract_pruning_keeps_named_and_recent_workloads(url: str) -> None:
    """Old workloads no outcome names go; a named one and a recent one stay."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    now = [start]
    with PerfStore.open(url, clock=lambda: now[0]) as store:
        store.add_workload(IDS[0], b"named", device="t4", gpu_count=1)
        store.add_workload(IDS[1], b"orphan", device="t4", gpu_count=1)
        store.record_job_outcome(job_uid="a", device="t4", gpu_count=1, estimated_seconds=1.0,
                                 actual_seconds=1.0, workload_id=IDS[0])
        store.record_job_outcome(job_uid="plain", device="t4", gpu_count=1,
                                 estimated_seconds=1.0, actual_seconds=1.0)
        now[0] = start + timedelta(days=40)
        store.add_workload(IDS[2], b"recent", device="t4", gpu_count=1)
        assert store.prune_workloads(older_than=start + timedelta(days=30)) == 1
        assert store.prune_workloads(older_than=start + timedelta(days=30)) == 0
        assert [r.workload_id for r in store.outcome_workloads(limit=10)] == [IDS[0]]
        # Gone, so a later plan of that workload stores it afresh.
        assert store.add_workload(IDS[1], b"orphan", device="t4", gpu_count=1) is True
        assert store.add_workload(IDS[2], b"recent", device="t4", gpu_count=1) is False


def test_contract_on_sqlite(tmp_path: Path) -> None:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as store:
        contract_workloads_link_outcomes(store)
    contract_pruning_keeps_named_and_recent_workloads(f"sqlite:///{tmp_path / 'prune.db'}")


@pytest.mark.postgres
def test_contract_on_postgres(pg_url: str) -> None:  # noqa: F811
    with PerfStore.open(pg_url) as store:
        contract_workloads_link_outcomes(store)
    with PerfStore.open(pg_url) as store, store.engine.begin() as conn:
        conn.execute(text("delete from job_outcomes"))
        conn.execute(text("delete from plan_workloads"))
    contract_pruning_keeps_named_and_recent_workloads(pg_url)


@pytest.mark.parametrize(("bad", "field"), [
    ("abc", "workload_id"), ("AB" * 32, "workload_id"), ("ab" * 32 + "0", "workload_id")])
def test_bad_ids_are_named(tmp_path: Path, bad: str, field: str) -> None:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as store:
        with pytest.raises(errors.InvalidRequestError) as add:
            store.add_workload(bad, b"x", device="t4", gpu_count=1)
        with pytest.raises(errors.InvalidRequestError) as record:
            store.record_job_outcome(job_uid="j", device="t4", gpu_count=1,
                                     estimated_seconds=1.0, actual_seconds=1.0, workload_id=bad)
        assert add.value.field == record.value.field == field
        assert store.outcome_counts() == (0, 0)


def test_the_store_refuses_a_workload_over_the_cap(tmp_path: Path) -> None:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as store:
        with pytest.raises(errors.InvalidRequestError, match="at most 2097152 bytes"):
            store.add_workload(IDS[0], b"x" * (limits.MAX_WORKLOAD_BYTES + 1), device="t4",
                               gpu_count=1)
        assert store.add_workload(IDS[0], b"x" * limits.MAX_WORKLOAD_BYTES, device="t4",
                                  gpu_count=1)


def test_migration_0007_on_an_existing_database_keeps_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    database_at(url, "0006", [
        "insert into job_outcomes (job_uid, device, gpu_count, estimated_seconds, "
            "actual_seconds, model_digest, created_at, steps) values ('old', 't4', 1, 10.0, "
            "12.0, 'd', '2025-01-01', 500)",
        "insert into job_outcomes (job_uid, device, gpu_count, estimated_seconds, "
            "actual_seconds, model_digest, created_at) values ('older', 'l4', 2, 20.0, 18.0, "
            "'', '2024-01-01')",
    ])
    with PerfStore.open(url) as store:
        with store.engine.connect() as conn:
            assert conn.execute(text("select version_num from alembic_version")).scalar() == "0009"
        frame = store.job_outcomes()
        assert frame["job_uid"].tolist() == ["old", "older"]
        assert frame["steps"].tolist()[0] == 500
        assert frame["workload_id"].isna().all()
        assert store.outcome_counts() == (2, 0)
        assert store.outcome_workloads(limit=200) == []
        # The new table and column work on the upgraded file.
        store.add_workload(IDS[3], b"w", device="t4", gpu_count=1)
        store.record_job_outcome(job_uid="new", device="t4", gpu_count=1,
                                 estimated_seconds=1.0, actual_seconds=2.0, workload_id=IDS[3])
        assert [r.job_uid for r in store.outcome_workloads(limit=200)] == ["new"]
