"""Bundle I/O: save → load predicts identically, version checks, resolution order, shipped."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.cost import features
from gpuplan_estimator.latency import bundles, regressors

FAST: dict[str, Any] = {"n_estimators": 15, "num_leaves": 7, "min_child_samples": 5, "n_jobs": 1}


@pytest.fixture(scope="module")
def fitted() -> bundles.Bundle:
    rng = np.random.default_rng(0)
    n_feat = len(features.feature_names("softmax"))
    x = rng.normal(size=(300, n_feat))
    y = 0.5 * x[:, 0] + rng.normal(0, 0.05, 300)
    model = regressors.LayerLatencyModel(**FAST).fit(x, y)
    cols = features.transfer_columns("softmax")
    transfer = regressors.LayerLatencyModel(**FAST).fit(x[:, cols], y)
    manifest = {"created": "2025-01-01T00:00:00+00:00", "backends": ["b"], "metrics": {}}
    return bundles.Bundle(models={"softmax": model}, manifest=manifest,
                         transfer_models={"softmax": transfer})


def test_save_load_predicts_identically(fitted: bundles.Bundle, tmp_path: Path) -> None:
    bundles.save_bundle(fitted, tmp_path / "b")
    loaded = bundles.load_bundle(tmp_path / "b")
    x = np.random.default_rng(1).normal(size=(50, len(features.feature_names("softmax"))))
    want = fitted.models["softmax"].predict_quantiles(x)
    got = loaded.models["softmax"].predict_quantiles(x)
    for key in ("median", "p10", "p90"):
        np.testing.assert_array_equal(got[key], want[key])
    cols = features.transfer_columns("softmax")
    np.testing.assert_array_equal(loaded.transfer_models["softmax"].predict(x[:, cols]),
                                  fitted.transfer_models["softmax"].predict(x[:, cols]))
    assert (tmp_path / "b" / "softmax.transfer.p10.txt.gz").is_file()
    manifest = loaded.manifest
    assert manifest["feature_schema_version"] == features.FEATURE_SCHEMA_VERSION
    assert manifest["files"]["softmax"] == {
        "median": "softmax.txt.gz", "p10": "softmax.p10.txt.gz", "p90": "softmax.p90.txt.gz"}
    assert loaded.models["softmax"].get_params() == fitted.models["softmax"].get_params()
    assert not list((tmp_path / "b").glob("*.pkl"))


def _rewrite_manifest(path: Path, **changes: object) -> None:
    manifest = json.loads((path / bundles.MANIFEST).read_text())
    manifest.update(changes)
    (path / bundles.MANIFEST).write_text(json.dumps(manifest))


def test_feature_schema_mismatch_names_both_versions(fitted: bundles.Bundle, tmp_path: Path
                                                     ) -> None:
    bundles.save_bundle(fitted, tmp_path)
    _rewrite_manifest(tmp_path, feature_schema_version="0-old")
    with pytest.raises(errors.BundleError, match=rf"'0-old'.*'{features.FEATURE_SCHEMA_VERSION}'"):
        bundles.load_bundle(tmp_path)


@pytest.mark.parametrize("offsets", [
    [], {"t4": []}, {"t4": {"gemm": {"log_offset": 0.1, "rows": 20}}},
    {"t4": {"gemm": {"log_offset": "x", "log_base_slope": 0.0, "rows": 20}}},
])
def test_malformed_probe_offsets_are_refused_on_load(fitted: bundles.Bundle, tmp_path: Path,
                                                     offsets: object) -> None:
    bundles.save_bundle(fitted, tmp_path)
    _rewrite_manifest(tmp_path, probe_offsets=offsets)
    with pytest.raises(errors.BundleError, match=r"manifest.json: .*'probe_offsets'"):
        bundles.load_bundle(tmp_path)


def test_probe_offsets_load_as_corrections(fitted: bundles.Bundle, tmp_path: Path) -> None:
    bundles.save_bundle(fitted, tmp_path)
    entry = {"log_offset": 0.25, "log_base_slope": -0.05, "rows": 20}
    _rewrite_manifest(tmp_path, probe_offsets={"t4": {"softmax": entry}})
    loaded = bundles.load_bundle(tmp_path)
    catalog = devices.load_catalog()
    got = loaded.probe_correction("softmax", catalog.resolve("t4"))
    # Written before probes recorded their size range: the slope applies unbounded.
    assert got == regressors.ProbeCorrection(0.25, -0.05)
    ranged = {**entry, "log_base_min": -3.0, "log_base_max": 1.5}
    _rewrite_manifest(tmp_path, probe_offsets={"t4": {"softmax": ranged}})
    got = bundles.load_bundle(tmp_path).probe_correction("softmax", catalog.resolve("t4"))
    assert got == regressors.ProbeCorrection(0.25, -0.05, -3.0, 1.5)
    assert loaded.probe_correction("gemm", catalog.resolve("t4")) is None
    assert loaded.probe_correction("softmax", catalog.resolve("v100-pcie-32gb")) is None


def test_broken_bundles_name_the_file(fitted: bundles.Bundle, tmp_path: Path) -> None:
    with pytest.raises(errors.BundleError, match="no manifest"):
        bundles.load_bundle(tmp_path)
    bundles.save_bundle(fitted, tmp_path)
    # A model file is parsed when its kernel is first looked up; the error names the file.
    (tmp_path / "softmax.p90.txt.gz").write_text("garbage")
    loaded = bundles.load_bundle(tmp_path)
    assert "softmax" in loaded.models  # membership reads no file
    with pytest.raises(errors.BundleError, match=r"softmax\.p90\.txt\.gz: cannot read model"):
        loaded.models["softmax"]
    (tmp_path / "softmax.p90.txt.gz").write_bytes(gzip.compress(b"garbage"))
    with pytest.raises(errors.BundleError, match=r"softmax\.p90\.txt\.gz: not a LightGBM"):
        bundles.load_bundle(tmp_path).models.get("softmax")
    whole = (tmp_path / "softmax.p10.txt.gz").read_bytes()
    (tmp_path / "softmax.p10.txt.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(errors.BundleError, match=r"softmax\.p10\.txt\.gz: cannot read model"):
        bundles.load_bundle(tmp_path).models["softmax"]
    # A file the manifest names but the directory lacks is refused by the load itself.
    (tmp_path / "softmax.transfer.txt.gz").unlink()
    with pytest.raises(errors.BundleError, match=r"softmax\.transfer\.txt\.gz: cannot read model"):
        bundles.load_bundle(tmp_path)


def test_model_files_are_reproducible_and_plain_text_bundles_still_load(
    fitted: bundles.Bundle, tmp_path: Path
) -> None:
    first = bundles.save_bundle(fitted, tmp_path / "a")
    second = bundles.save_bundle(fitted, tmp_path / "b")
    assert (first / "softmax.txt.gz").read_bytes() == (second / "softmax.txt.gz").read_bytes()
    # A bundle written before compression: plain .txt files named in the manifest.
    manifest = json.loads((first / bundles.MANIFEST).read_text())
    for key in ("files", "transfer_files"):
        for parts in manifest[key].values():
            for part, name in parts.items():
                plain = name.removesuffix(".gz")
                (first / plain).write_bytes(gzip.decompress((first / name).read_bytes()))
                (first / name).unlink()
                parts[part] = plain
    (first / bundles.MANIFEST).write_text(json.dumps(manifest))
    x = np.random.default_rng(2).normal(size=(20, len(features.feature_names("softmax"))))
    np.testing.assert_array_equal(bundles.load_bundle(first).models["softmax"].predict(x),
                                  fitted.models["softmax"].predict(x))
    bundles.save_bundle(fitted, first)  # rewriting replaces the plain files
    assert not list(first.glob("*.txt"))


def test_oversized_model_text_is_refused_after_bounded_gunzip(
    fitted: bundles.Bundle, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundles.save_bundle(fitted, tmp_path)
    monkeypatch.setattr(bundles, "MAX_MODEL_FILE_BYTES", 1000)
    with pytest.raises(errors.BundleError, match=r"softmax.*\.txt\.gz: model text exceeds 1000"):
        bundles.load_bundle(tmp_path).models["softmax"]


def test_find_bundle_prefers_explicit_then_newest_valid_then_shipped(
    fitted: bundles.Bundle, tmp_path: Path
) -> None:
    data = tmp_path / "bundles"
    assert bundles.find_bundle_with_origin(None, data) == (bundles.SHIPPED_BUNDLE, "shipped")
    for name, created in (("old", "2025-01-01"), ("new", "2025-06-01"), ("stale", "2026-01-01")):
        bundles.save_bundle(bundles.Bundle(fitted.models, {"created": created}), data / name)
    _rewrite_manifest(data / "stale", feature_schema_version="0-old")  # newest but unusable
    (data / "half-written").mkdir()
    assert bundles.find_bundle_with_origin(None, data) == (data / "new", "data-dir")
    assert bundles.find_bundle(data / "old", data) == data / "old"
    with pytest.raises(errors.BundleError):
        bundles.find_bundle(data / "stale", data)


def test_default_data_dir_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert bundles.default_data_dir() == tmp_path / "gpuplan" / "bundles"


@pytest.mark.skipif(not (bundles.SHIPPED_BUNDLE / bundles.MANIFEST).exists(),
                    reason="shipped bundle not built yet (make models)")
def test_shipped_bundle_loads_and_is_small() -> None:
    size = sum(f.stat().st_size for f in bundles.SHIPPED_BUNDLE.iterdir())
    assert size < 20 * 1024 * 1024
    loaded = bundles.load_bundle(bundles.SHIPPED_BUNDLE, origin="shipped")
    kernels = {"gemm", "conv2d", "elementwise", "layernorm", "softmax"}
    assert kernels <= set(loaded.models) and kernels <= set(loaded.transfer_models)
    for kernel, metrics in loaded.manifest["metrics"].items():
        assert metrics["random_split"]["rows"] > 0, kernel
    assert os.path.basename(str(loaded.path)) == "bundle"
