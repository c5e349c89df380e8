"""What `PerfStore`'s model bundles must do on every database (SQLite and PostgreSQL): each
function takes an empty, migrated store and a directory for bundles."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.perfdb.store import PerfStore, UnknownBundleError
from gpuplan_testing import perfdb_contract
from gpuplan_testing.bundle_builders import tiny_bundle


def _states(store: PerfStore) -> dict[int, str]:
    return {b.version: b.state for b in store.bundles()}


def contract_add_stores_bytes_and_provenance(store: PerfStore, tmp: Path) -> None:
    directory = tiny_bundle(tmp / "a", seed=1, commit="deadbee", rows=250)
    version = store.add_bundle(directory, reason="trained on the nightly rows")
    info, data = store.bundle(version)
    assert data == bundles.pack_bundle(directory)
    assert (info.version, info.state, info.reason) == (version, "candidate",
                                                       "trained on the nightly rows")
    assert (info.rows, info.git_commit) == (250, "deadbee")
    assert info.data_digest == f"sha256:{1:064x}"
    assert info.metrics["softmax"]["random_split"]["mape_pct"] == 11.0
    assert info.size_bytes == len(data) and info.bundle_sha256 == bundles.packed_digest(data)
    assert store.active_bundle() is None and store.active_version() is None
    # From bytes too, and versions only grow.
    assert store.add_bundle(data) == version + 1


def contract_at_most_one_active_and_rollback(store: PerfStore, tmp: Path) -> None:
    data = [bundles.pack_bundle(tiny_bundle(tmp / f"b{i}", seed=i)) for i in range(3)]
    v1 = store.add_bundle(data[0], state="active", reason="first")
    v2 = store.add_bundle(data[1])
    assert _states(store) == {v1: "active", v2: "candidate"}
    assert store.bundle_changed_since(v1) is False and store.bundle_changed_since(None) is True
    assert store.activate(v2, "better held out") == v2
    assert _states(store) == {v1: "retired", v2: "active"}
    assert store.bundle(v1)[0].reason == f"replaced by version {v2}"
    assert store.active_bundle() == (v2, data[1])
    assert store.bundle_changed_since(v1) is True
    v3 = store.add_bundle(data[2], state="active", reason="promoted")
    assert _states(store) == {v1: "retired", v2: "retired", v3: "active"}
    assert store.activate(v1, "rollback") == v1  # a retired version is the rollback
    assert _states(store) == {v1: "active", v2: "retired", v3: "retired"}
    assert store.bundle(v1)[0].reason == "rollback"
    assert store.activate(v1, "again") == v1  # activating the active one changes nothing else
    assert list(_states(store).values()).count("active") == 1


def contract_unknown_versions_are_named(store: PerfStore, tmp: Path) -> None:
    v1 = store.add_bundle(tiny_bundle(tmp / "c", seed=0), state="active")
    with pytest.raises(UnknownBundleError, match="no model bundle version 99 in"):
        store.activate(99, "typo")
    with pytest.raises(UnknownBundleError, match="version 98"):
        store.bundle(98)
    assert _states(store) == {v1: "active"}  # the failed activation retired nothing


def contract_bad_bundles_are_refused(store: PerfStore, tmp: Path) -> None:
    with pytest.raises(errors.BundleError, match="not a packed model bundle"):
        store.add_bundle(b"not a tar")
    with pytest.raises(errors.BundleError, match="over the"):
        store.add_bundle(b"\0" * (bundles.MAX_PACKED_BUNDLE_BYTES + 1))
    with pytest.raises(errors.InvalidRequestError, match="state"):
        store.add_bundle(tiny_bundle(tmp / "d"), state="retired")
    assert store.bundles() == []


def contract_the_database_refuses_a_second_active_row(store: PerfStore, tmp: Path) -> None:
    """The partial unique index holds even for a writer that bypasses the store."""
    from sqlalchemy import text

    data = bundles.pack_bundle(tiny_bundle(tmp / "e"))
    store.add_bundle(data, state="active")
    v2 = store.add_bundle(data)
    with pytest.raises(Exception, match=r"(?i)unique|duplicate"), store.engine.begin() as conn:
        conn.execute(text(f"update model_bundles set state = 'active' where version = {v2}"))
    assert _states(store)[v2] == "candidate"


def contract_racing_activations_leave_one_active(
        stores: list[PerfStore], tmp: Path, trials: int = 10) -> None:
    """Two stores activate different versions at the same moment: both succeed (one after the
    other) and exactly one version is active."""
    data = [bundles.pack_bundle(tiny_bundle(tmp / f"r{i}", seed=i)) for i in range(2)]
    versions = [stores[0].add_bundle(d) for d in data]
    for _ in range(trials):
        results = perfdb_contract.race(stores, _activate_own(stores, versions))
        assert not [r for r in results if isinstance(r, BaseException)], results
        states = _states(stores[0])
        assert list(states.values()).count("active") == 1, states


def _activate_own(stores: list[PerfStore], versions: list[int]) -> Callable[[PerfStore], int]:
    def work(store: PerfStore) -> int:
        return store.activate(versions[stores.index(store)], "race")

    return work


CONTRACT: dict[str, Callable[[PerfStore, Path], None]] = {
    name.removeprefix("contract_"): fn for name, fn in dict(globals()).items()
    if name.startswith("contract_") and name != "contract_racing_activations_leave_one_active"
}
