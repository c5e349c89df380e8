"""A retrain keeps the fits made on profiled GPU steps (`training.carry`): the tensor-core GEMM
utilisation, the host model and the step-level interval spread reach the new bundle from the
database's active bundle, else the shipped one, or from --carry-from; --no-carry drops them, and
a broken one is refused by name. Through the real `main()` with real LightGBM fits on a small
SQLite database."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuplan_estimator.cost import aligned_gemm
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.step import host
from gpuplan_estimator.training import carry
from gpuplan_testing.bundle_builders import tiny_bundle

from .test_candidates import _run
from .test_candidates import db as db  # the fixture

SHIPPED = bundles.read_manifest(bundles.SHIPPED_BUNDLE)
OTHER_FIT = {"log_util": {"half": -0.1}, "log_sigma": 0.3}


def _candidate_manifest(db: str, capsys: pytest.CaptureFixture[str], *flags: str
                        ) -> tuple[dict[str, Any], dict[str, Any]]:
    code, out, err = _run(capsys, "train", "--db", db, "--candidate", "--max-rows", "300",
                          *flags, "-o", "json")
    assert code == 0, err
    doc = json.loads(out)
    with PerfStore.open(db) as store:
        _, data = store.bundle(doc["version"])
    return doc, bundles.packed_manifest(data)


def test_the_first_candidate_keeps_the_shipped_fits_then_the_active_bundles(
        db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc, manifest = _candidate_manifest(db, capsys)
    for key in (aligned_gemm.MANIFEST_KEY, host.MANIFEST_KEY, intervals.STEP_SIGMA_KEY,
                aligned_gemm.PROVENANCE_KEY, host.PROVENANCE_KEY,
                intervals.STEP_SIGMA_PROVENANCE_KEY):
        assert manifest[key] == SHIPPED[key]
    assert doc["carried"] == manifest[carry.CARRIED_KEY] == {
        "source": "shipped bundle",
        "keys": [aligned_gemm.MANIFEST_KEY, host.MANIFEST_KEY, intervals.STEP_SIGMA_KEY]}

    # An active bundle with its own fit (and no host model): the next retrain keeps that.
    active = tiny_bundle(tmp_path / "active")
    bundles.update_manifest(active, {aligned_gemm.MANIFEST_KEY: OTHER_FIT})
    assert _run(capsys, "models", "add", str(active), "--db", db)[0] == 0
    assert _run(capsys, "models", "promote", "2", "--db", db, "--force")[0] == 0
    doc, manifest = _candidate_manifest(db, capsys)
    assert manifest[aligned_gemm.MANIFEST_KEY] == OTHER_FIT
    assert host.MANIFEST_KEY not in manifest and aligned_gemm.PROVENANCE_KEY not in manifest
    assert doc["carried"] == {"source": "database bundle version 2",
                              "keys": [aligned_gemm.MANIFEST_KEY]}


def test_no_carry_keeps_nothing_and_says_so(db: str, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    _, manifest = _candidate_manifest(db, capsys, "--no-carry")
    assert not {aligned_gemm.MANIFEST_KEY, host.MANIFEST_KEY, intervals.STEP_SIGMA_KEY,
                carry.CARRIED_KEY} & set(manifest)
    code, out, _ = _run(capsys, "train", "--db", db, "--candidate", "--max-rows", "300",
                        "--no-carry")
    assert code == 0 and "kept no fits on profiled GPU steps" in out


def test_carry_from_names_the_bundle_and_refuses_a_broken_fit(
        db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tiny_bundle(tmp_path / "base")
    bundles.update_manifest(base, {aligned_gemm.MANIFEST_KEY: OTHER_FIT})
    code, out, _ = _run(capsys, "train", "--db", db, "--candidate", "--max-rows", "300",
                        "--carry-from", str(base))
    assert code == 0 and f"kept aligned_gemm from the {base}" in out

    bundles.update_manifest(base, {aligned_gemm.MANIFEST_KEY: {"log_util": {},
                                                               "log_sigma": 0.1}})
    code, _, err = _run(capsys, "train", "--db", db, "--candidate", "--carry-from", str(base))
    assert code == 2 and f"{base}: manifest.aligned_gemm.log_util" in err
    with PerfStore.open(db) as store:  # refused before anything was fitted or stored
        assert len(store.bundles()) == 1
    code, _, err = _run(capsys, "train", "--db", db, "--no-carry", "--carry-from", str(base))
    assert code == 2 and "not allowed with argument" in err


def test_a_host_model_or_step_spread_that_does_not_read_is_named() -> None:
    with pytest.raises(Exception, match=r"bundle X: manifest.host_model") as caught:
        carry.profile_fits({host.MANIFEST_KEY: {"probe": {}}}, "bundle X")
    assert "probe' and 'coefficients'" in str(caught.value)
    with pytest.raises(Exception, match=r"bundle X: manifest.step_log_sigma.train"):
        carry.profile_fits({intervals.STEP_SIGMA_KEY: {"inference": {"fp32": 0.1}}},
                           "bundle X")
    assert carry.profile_fits({"metrics": {}}, "bundle X") == {}
