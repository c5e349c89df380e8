"""PerfStore on a real PostgreSQL server started here, running the same contract as SQLite.

The server comes from `gpuplan_testing.postgres_server` (initdb + pg_ctl in a temporary
directory). Skipped when no PostgreSQL binaries exist, but failed under CI=true.

Beyond the contract: two stores on one database writing the same frame, job outcome or device
at the same moment (30 trials each, released by a barrier) keep one copy and raise nothing, and
database failures of `record_job_outcome` are `DatabaseError`.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.perfdb import connections
from gpuplan_estimator.perfdb.store import PerfStore, StoredOutcome
from gpuplan_testing import perfdb_contract as contract
from gpuplan_testing import postgres_server

pytestmark = pytest.mark.postgres

@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    """URL of a freshly started server (`gpuplan_testing.postgres_server`)."""
    with postgres_server.running_server() as url:
        yield url


@pytest.fixture
def pg_store(pg_server: str, request: pytest.FixtureRequest) -> Iterator[PerfStore]:
    name = "t_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:50].lower()
    with PerfStore.open(postgres_server.create_database(pg_server, name)) as store:
        yield store


@pytest.mark.parametrize("name", sorted(contract.CONTRACT))
def test_store_contract_on_postgres(pg_store: PerfStore, name: str) -> None:
    contract.CONTRACT[name](pg_store)


def _head_revision() -> str:
    """The newest migration shipped (so a new one needs no edit here)."""
    from alembic.script import ScriptDirectory

    from gpuplan_estimator.perfdb import migrations

    heads = ScriptDirectory(str(Path(migrations.__file__).parent)).get_heads()
    assert len(heads) == 1, heads
    return str(heads[0])


def test_migrations_applied_once(pg_store: PerfStore) -> None:
    from sqlalchemy import text

    def versions(store: PerfStore) -> list[str]:
        with store.engine.connect() as conn:
            return [row[0] for row in conn.execute(text("select version_num from alembic_version"))]

    head = _head_revision()
    assert versions(pg_store) == [head]
    run = pg_store.add_run(device="t4", backend="onnxruntime-1.23.2-cpu")
    assert pg_store.add_measurements(run, contract.frame(2)) == 2
    again = PerfStore.open(pg_store.engine.url.render_as_string(hide_password=False))
    try:  # a second open neither re-runs the migrations nor loses what is stored
        assert versions(again) == [head]
        assert [r.id for r in again.runs()] == [run]
        assert len(again.measurements(run_id=run)) == 2
    finally:
        again.close()


def test_missing_database_is_a_clear_error(pg_server: str) -> None:
    with pytest.raises(errors.DatabaseError, match=r"gpuplan:\*\*\*@.*/nope"):
        PerfStore.open(f"{pg_server}/nope", retries=0)


TRIALS = 30
ROWS = 20


@pytest.fixture
def two_writers(pg_store: PerfStore) -> Iterator[list[PerfStore]]:
    """`pg_store` and a second store on the same database, with its own connection pool."""
    other = PerfStore.open(pg_store.engine.url.render_as_string(hide_password=False))
    yield [pg_store, other]
    other.close()


def test_concurrent_writers_of_one_frame_store_it_once(two_writers: list[PerfStore]) -> None:
    failures: list[BaseException] = []
    for _ in range(TRIALS):
        run = two_writers[0].add_run(device="t4", backend="b")
        rows = contract.frame(ROWS)
        added = contract.race(two_writers,
                              partial(PerfStore.add_measurements, run_id=run, frame=rows))
        failures += [a for a in added if isinstance(a, BaseException)]
        assert sum(a for a in added if isinstance(a, int)) == ROWS
        assert len(two_writers[1].measurements(run_id=run)) == ROWS
    assert failures == []
    assert len(two_writers[0].measurements()) == TRIALS * ROWS


def test_concurrent_reports_of_one_job_store_one_outcome(two_writers: list[PerfStore]) -> None:
    for trial in range(TRIALS):
        got = contract.race(two_writers, partial(
            PerfStore.record_job_outcome, job_uid=f"job-{trial}", device="t4", gpu_count=1,
            estimated_seconds=10.0, actual_seconds=12.0))
        stored = [g for g in got if isinstance(g, StoredOutcome)]
        assert len(stored) == 2, got
        assert sorted(g.created for g in stored) == [False, True]
        assert stored[0].id == stored[1].id
    frame = two_writers[0].job_outcomes()
    assert len(frame) == TRIALS and frame["job_uid"].is_unique


def test_concurrent_benchmarks_register_a_device_once(two_writers: list[PerfStore]) -> None:
    for trial in range(TRIALS):
        spec = DeviceSpec(key=f"gpu{trial}", name="G", vendor="nvidia", memory_bytes=1 << 30,
                          mem_bandwidth_gbps=1.0, peak_tflops={"fp32": 1.0}, sm_count=1,
                          boost_clock_mhz=1.0, l2_cache_mb=1.0)
        upserts = contract.race(two_writers, partial(PerfStore.upsert_device, spec=spec))
        assert upserts == [None, None]
    assert len(two_writers[0].devices()) == TRIALS


def test_job_outcome_failures_are_database_errors(pg_store: PerfStore) -> None:
    from sqlalchemy import text

    with pg_store.engine.begin() as conn:
        conn.execute(text("drop table job_outcomes"))
    # PostgreSQL calls a missing table a ProgrammingError, which is not retried.
    with pytest.raises(errors.DatabaseError, match="job_outcomes"):
        pg_store.record_job_outcome(job_uid="u", device="t4", gpu_count=1,
                                    estimated_seconds=1.0, actual_seconds=1.0)


def test_server_stopped_midway_is_a_database_error(pg_store: PerfStore) -> None:
    """A store whose server went away (here: its port no longer answers) fails as DatabaseError."""
    url = pg_store.engine.url.set(port=postgres_server.free_port())
    gone = PerfStore(connections.create(url.render_as_string(hide_password=False)),
                     retries=1, retry_delay_seconds=0.01)
    with pytest.raises(errors.DatabaseError, match=r"after 2 attempt\(s\)"):
        gone.record_job_outcome(job_uid="u", device="t4", gpu_count=1, estimated_seconds=1.0,
                                actual_seconds=1.0)
