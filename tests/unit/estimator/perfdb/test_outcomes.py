"""Job outcomes on SQLite: one row per job uid, finite positive values only, migration 0004's
clean-up of earlier duplicates, and database failures as `DatabaseError`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from gpuplan_estimator.core import errors
from gpuplan_estimator.perfdb import connections
from gpuplan_estimator.perfdb.store import PerfStore, StoredOutcome
from gpuplan_testing.old_databases import database_at

GOOD: dict[str, Any] = {"job_uid": "u1", "device": "t4", "gpu_count": 2,
                        "estimated_seconds": 100.0, "actual_seconds": 120.0,
                        "model_digest": "sha256:abc"}


def test_a_repeated_job_uid_returns_the_first_row_and_writes_nothing(store: PerfStore) -> None:
    first = store.record_job_outcome(**GOOD)
    assert first == StoredOutcome(id=first.id, created=True)
    again = store.record_job_outcome(**{**GOOD, "actual_seconds": 9999.0, "gpu_count": 8})
    assert again == StoredOutcome(id=first.id, created=False)
    other = store.record_job_outcome(**{**GOOD, "job_uid": "u2"})
    assert other.created and other.id != first.id
    frame = store.job_outcomes()
    assert frame["job_uid"].tolist() == ["u1", "u2"]
    # The replay did not overwrite the first report either.
    assert frame["actual_seconds"].tolist() == [120.0, 120.0]
    assert frame["gpu_count"].tolist() == [2, 2]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("estimated_seconds", math.inf), ("estimated_seconds", math.nan),
        ("estimated_seconds", 0.0), ("estimated_seconds", -1.0), ("estimated_seconds", "10"),
        ("actual_seconds", -math.inf), ("actual_seconds", math.nan), ("actual_seconds", True),
        ("actual_seconds", 0),
        ("gpu_count", 0), ("gpu_count", 2**31), ("gpu_count", 1.5), ("gpu_count", True),
        ("job_uid", ""), ("job_uid", "x" * 129), ("device", ""), ("model_digest", "d" * 129),
    ],
)
def test_bad_values_are_refused_naming_the_field(
    store: PerfStore, field: str, value: object
) -> None:
    with pytest.raises(errors.InvalidRequestError) as info:
        store.record_job_outcome(**{**GOOD, field: value})
    assert info.value.field == field
    assert store.job_outcomes().empty


def test_largest_accepted_values_are_stored(store: PerfStore) -> None:
    got = store.record_job_outcome(**{**GOOD, "job_uid": "u" * 128, "gpu_count": 2**31 - 1,
                                      "estimated_seconds": 1e300, "actual_seconds": 5e-324})
    assert got.created
    row = store.job_outcomes().iloc[0]
    assert (row["gpu_count"], row["estimated_seconds"]) == (2**31 - 1, 1e300)


def test_migration_0004_keeps_the_first_outcome_of_each_job(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    insert = (
        "insert into job_outcomes (job_uid, device, gpu_count, estimated_seconds, "
        "actual_seconds, model_digest, created_at) values (:uid, 't4', 1, 10.0, :actual, '', "
        "'2025-01-01')")
    rows = [("a", 11.0), ("b", 20.0), ("a", 40.0), ("a", 80.0), ("b", 30.0)]
    database_at(url, "0003", [(insert, {"uid": uid, "actual": actual}) for uid, actual in rows])
    with PerfStore.open(url) as store:
        frame = store.job_outcomes()
        assert frame[["id", "job_uid", "actual_seconds"]].values.tolist() == [
            [1, "a", 11.0], [2, "b", 20.0]]
        assert store.record_job_outcome(**{**GOOD, "job_uid": "a"}) == StoredOutcome(1, False)


def test_unreachable_database_is_a_database_error() -> None:
    url = "postgresql+psycopg://gpuplan:s3cret@127.0.0.1:1/perf"
    store = PerfStore(connections.create(url), retries=1, retry_delay_seconds=0.01)
    with pytest.raises(errors.DatabaseError, match=r"after 2 attempt\(s\)") as info:
        store.record_job_outcome(**GOOD)
    assert "s3cret" not in str(info.value)


def test_a_broken_schema_is_a_database_error(store: PerfStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("drop table job_outcomes"))
    broken = PerfStore(store.engine, retries=0, retry_delay_seconds=0.0)
    with pytest.raises(errors.DatabaseError, match="job_outcomes"):
        broken.record_job_outcome(**GOOD)


def test_a_malformed_port_is_a_database_error_without_the_password() -> None:
    with pytest.raises(errors.DatabaseError, match="invalid database URL") as info:
        PerfStore.open("postgresql+psycopg://gpuplan:s3cret@db:notaport/perf", retries=0)
    assert "s3cret" not in str(info.value) and "gpuplan:***@db:notaport" in str(info.value)


def test_an_unsupported_backend_is_refused() -> None:
    with pytest.raises(errors.DatabaseError, match="not one of sqlite, postgresql"):
        PerfStore.open("mysql://u@h/db", retries=0)
