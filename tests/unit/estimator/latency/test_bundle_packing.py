"""Bundles as bytes (issue #17): pack → unpack → load predicts identically, packing is
reproducible, hostile archives are refused, and the cache of the database's active bundle
(`selection.sync_active_bundle`) fetches bytes only when the active version changes."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path

import numpy as np
import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.cost import features
from gpuplan_estimator.latency import bundles, learned, selection
from gpuplan_testing.bundle_builders import tiny_bundle


def test_round_trip_bytes_to_dir_to_learned_predictor(tmp_path: Path) -> None:
    original = bundles.load_bundle(tiny_bundle(tmp_path / "src", seed=2))
    data = bundles.pack_bundle(tmp_path / "src")
    unpacked = bundles.unpack_bundle(data, tmp_path / "out" / "v1")
    loaded = bundles.load_bundle(unpacked)
    assert sorted(p.name for p in unpacked.iterdir()) == sorted(
        p.name for p in (tmp_path / "src").iterdir())
    x = np.random.default_rng(3).normal(size=(40, len(features.feature_names("softmax"))))
    for part, values in original.models["softmax"].predict_quantiles(x).items():
        np.testing.assert_array_equal(loaded.models["softmax"].predict_quantiles(x)[part], values)
    predictor = learned.LearnedPredictor(loaded)
    assert predictor.bundle.manifest["commit"] == "abc1234"
    assert not list((tmp_path / "out").glob(".v1-*"))  # the staging directory is gone


def test_the_shipped_bundle_round_trips_under_the_cap(tmp_path: Path) -> None:
    data = bundles.pack_bundle(bundles.SHIPPED_BUNDLE)
    assert len(data) < bundles.MAX_PACKED_BUNDLE_BYTES
    assert data == bundles.pack_bundle(bundles.SHIPPED_BUNDLE)  # reproducible bytes
    assert bundles.packed_manifest(data) == bundles.read_manifest(bundles.SHIPPED_BUNDLE)
    out = bundles.unpack_bundle(data, tmp_path / "v1")
    for path in bundles.SHIPPED_BUNDLE.iterdir():
        assert (out / path.name).read_bytes() == path.read_bytes(), path.name


def _tar(members: list[tarfile.TarInfo], contents: list[bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, content in zip(members, contents, strict=True):
            tar.addfile(info, io.BytesIO(content) if info.isfile() else None)
    return buffer.getvalue()


def _file(name: str, size: int = 2) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def _link(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return info


@pytest.mark.parametrize(("members", "contents", "message"), [
    ([_file("../escape")], [b"{}"], "not a plain file name"),
    ([_file("sub/manifest.json")], [b"{}"], "not a plain file name"),
    ([_link("manifest.json")], [b""], "not a plain file name"),
    ([_file("x.txt.gz")], [b"{}"], "no manifest"),
    ([_file("manifest.json")], [b"{}"], "schema_version"),
])
def test_hostile_or_broken_archives_are_refused(
        tmp_path: Path, members: list[tarfile.TarInfo], contents: list[bytes],
        message: str) -> None:
    data = _tar(members, contents)
    with pytest.raises(errors.BundleError, match=message):
        bundles.unpack_bundle(data, tmp_path / "v1")
    assert not (tmp_path / "v1").exists() and not (tmp_path.parent / "escape").exists()
    assert [p.name for p in tmp_path.iterdir()] == []


def test_a_tar_bomb_stops_at_the_unpacked_cap(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bundles, "MAX_UNPACKED_BUNDLE_BYTES", 1000)
    data = _tar([_file("a.txt.gz", 600), _file("b.txt.gz", 600)], [b"0" * 600, b"1" * 600])
    with pytest.raises(errors.BundleError, match="unpacks to over"):
        bundles.packed_manifest(data)


class FakeSource:
    """A `selection.BundleSource` counting how often the bytes are fetched."""

    def __init__(self, versions: dict[int, bytes]) -> None:
        self.versions = versions
        self.active: int | None = None
        self.fetches = 0

    def active_bundle(self) -> tuple[int, bytes] | None:
        self.fetches += 1
        return None if self.active is None else (self.active, self.versions[self.active])

    def bundle_changed_since(self, version: int | None) -> bool:
        return self.active != version


def test_a_cache_left_by_another_database_is_not_served_under_its_version(
        tmp_path: Path) -> None:
    # Version numbers restart in every database: a service started on a new database with the
    # data dir's cache of an old one must not serve the old database's v1 as its own.
    cache = tmp_path / "cache"
    cache.mkdir()
    old = FakeSource({1: bundles.pack_bundle(tiny_bundle(tmp_path / "old", seed=1))})
    old.active = 1
    assert selection.sync_active_bundle(cache, old) == 1
    new_bytes = bundles.pack_bundle(tiny_bundle(tmp_path / "new", seed=2))
    new = FakeSource({1: new_bytes})
    new.active = 1
    assert selection.sync_active_bundle(cache, new) == 1  # trusted: the stale v1 stays
    assert selection.sync_active_bundle(cache, new, trust_cache=False) == 1
    assert (cache / "v1" / selection.PACKED_DIGEST).read_text().strip() == \
        hashlib.sha256(new_bytes).hexdigest()
    fetched = new.fetches
    assert selection.sync_active_bundle(cache, new, trust_cache=False) == 1
    assert new.fetches == fetched + 1  # fetched to compare, not unpacked again


def test_the_cache_follows_the_active_version_and_fetches_only_on_change(tmp_path: Path) -> None:
    source = FakeSource({v: bundles.pack_bundle(tiny_bundle(tmp_path / f"b{v}", seed=v))
                         for v in (1, 2)})
    cache = tmp_path / "cache"
    cache.mkdir()
    assert selection.sync_active_bundle(cache, source) is None
    assert selection.select_cached_predictor(cache) is None  # callers fall back to files
    source.active = 1
    assert selection.sync_active_bundle(cache, source) == 1
    assert selection.sync_active_bundle(cache, source) == 1
    assert source.fetches == 2  # the unchanged second poll did not fetch
    found = selection.select_cached_predictor(cache)
    assert found is not None
    assert found[1] == f"bundle:{cache / 'v1'} (database v1)"
    assert selection.bundle_version_of(found[1]) == 1
    source.active = 2
    assert selection.sync_active_bundle(cache, source) == 2
    assert selection.cached_active_version(cache) == 2
    source.active = 1  # rollback: the unpacked v1 is reused
    assert selection.sync_active_bundle(cache, source) == 1
    assert sorted(p.name for p in cache.iterdir()) == ["ACTIVE", "v1", "v2"]
    source.active = None
    assert selection.sync_active_bundle(cache, source) is None
    assert not (cache / "ACTIVE").exists()


@pytest.mark.parametrize(("source", "version"), [
    ("bundle:/c/v12 (database v12)", 12), ("bundle:/d/b (data-dir)", None), ("roofline", None),
    ("bundle:/x (database v3), CPU as torch", None),
])
def test_bundle_version_of_a_predictor_source(source: str, version: int | None) -> None:
    assert selection.bundle_version_of(source) == version
