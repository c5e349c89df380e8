"""Model bundles in the performance database (issue #17, migration 0006) on SQLite: an existing
database upgrades with its rows kept, the store contract (provenance, one active, rollback,
named unknown versions, refused bad bundles, the index behind the invariant), racing activations.
The same contract runs on PostgreSQL in `test_model_bundles_postgres.py`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing import bundle_store_contract as contract
from gpuplan_testing.bundle_builders import tiny_bundle
from gpuplan_testing.old_databases import database_at


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PerfStore]:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as s:
        yield s


@pytest.mark.parametrize("name", sorted(contract.CONTRACT))
def test_bundle_contract_on_sqlite(store: PerfStore, tmp_path: Path, name: str) -> None:
    contract.CONTRACT[name](store, tmp_path)


def test_migration_0006_on_an_existing_database_keeps_its_rows(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    database_at(url, "0005", [
        "insert into job_outcomes (job_uid, device, gpu_count, estimated_seconds, "
            "actual_seconds, model_digest, created_at) values ('old', 't4', 1, 10.0, 12.0, "
            "'d', '2025-01-01')",
        "insert into model_versions (created_at, data_digest, metrics_json, bundle_path) "
            "values ('2025-01-01', 'sha256:0', '{}', '/b')",
    ])
    with PerfStore.open(url) as store:
        with store.engine.connect() as conn:
            assert conn.execute(text("select version_num from alembic_version")).scalar() == "0009"
        assert store.job_outcomes()["job_uid"].tolist() == ["old"]
        assert len(store.model_versions()) == 1
        assert store.bundles() == []
        version = store.add_bundle(tiny_bundle(tmp_path / "b"), state="active")
        assert store.active_version() == version == 1


def test_versions_are_never_reused(tmp_path: Path) -> None:
    """AUTOINCREMENT: even after the newest row is gone, the next version is a new number."""
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url) as store:
        v1 = store.add_bundle(tiny_bundle(tmp_path / "b"))
        with store.engine.begin() as conn:
            conn.execute(text(f"delete from model_bundles where version = {v1}"))
        assert store.add_bundle(tmp_path / "b") == v1 + 1


def test_racing_activations_on_one_sqlite_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    stores = [PerfStore.open(url), PerfStore.open(url)]
    try:
        contract.contract_racing_activations_leave_one_active(stores, tmp_path)
    finally:
        for s in stores:
            s.close()


def test_set_bundle_reason_keeps_the_state_and_names_unknown_versions(
        store: PerfStore, tmp_path: Path) -> None:
    """The promotion gate's refusal is stored on the candidate (issue #17) without touching its
    state or the active bundle's."""
    from gpuplan_estimator.core import errors
    from gpuplan_estimator.perfdb.store import UnknownBundleError

    directory = tiny_bundle(tmp_path / "b")
    active = store.add_bundle(directory, state="active", reason="first")
    candidate = store.add_bundle(directory)
    store.set_bundle_reason(candidate, "refused: worse on random-split MAPE")
    got = {b.version: (b.state, b.reason) for b in store.bundles()}
    assert got == {active: ("active", "first"),
                   candidate: ("candidate", "refused: worse on random-split MAPE")}
    with pytest.raises(UnknownBundleError, match="version 99"):
        store.set_bundle_reason(99, "x")
    with pytest.raises(errors.InvalidRequestError, match="reason"):
        store.set_bundle_reason(candidate, "x" * 4001)
