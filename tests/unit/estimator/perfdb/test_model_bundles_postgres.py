"""The model-bundle store contract (`gpuplan_testing.bundle_store_contract`) on a real
PostgreSQL server started here, as `tests/integration/test_perfdb_postgres.py` starts it
(initdb/pg_ctl on a free port, as `nobody` when run as root). Skipped when no PostgreSQL
binaries exist, failed under CI=true. Beyond the contract: two stores activating different
versions at the same moment leave one active (the store locks the table on PostgreSQL, where
two READ COMMITTED transactions would otherwise each retire the old row and both activate)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing import bundle_store_contract as contract
from gpuplan_testing import postgres_server

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def pg_server() -> Iterator[str]:
    with postgres_server.running_server() as url:
        yield url


@pytest.fixture
def pg_url(pg_server: str, request: pytest.FixtureRequest) -> str:
    name = "b_" + "".join(c if c.isalnum() else "_" for c in request.node.name)[:50].lower()
    return postgres_server.create_database(pg_server, name)


@pytest.mark.parametrize("name", sorted(contract.CONTRACT))
def test_bundle_contract_on_postgres(pg_url: str, tmp_path: Path, name: str) -> None:
    with PerfStore.open(pg_url) as store:
        contract.CONTRACT[name](store, tmp_path)


def test_racing_activations_on_postgres(pg_url: str, tmp_path: Path) -> None:
    stores = [PerfStore.open(pg_url), PerfStore.open(pg_url)]
    try:
        contract.contract_racing_activations_leave_one_active(stores, tmp_path, trials=20)
    finally:
        for s in stores:
            s.close()
