"""`gpuplan train --db --candidate [--promote]` and `gpuplan models promote` through the real
`main()` on a small SQLite database with real LightGBM fits: the candidate and its per-GPU rows
land in model_bundles, the gate promotes an equal candidate and refuses a worse one (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpuplan_estimator.interfaces.cli import main as cli
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.training import fitting
from gpuplan_testing.bundle_builders import tiny_bundle

from .test_fitting import synthetic_frame


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture()
def db(tmp_path: Path) -> str:
    """A database with softmax rows of three GPUs (one benchmark run each)."""
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    frame = synthetic_frame(120)
    frame = frame[frame["kernel"] == "softmax"]
    with PerfStore.open(url) as store:
        for device, rows in frame.groupby("device"):
            run = store.add_run(device=str(device), backend="pytorch-2.1.0+cu121")
            store.add_measurements(run, rows)
            store.finish_run(run, "done")
    return url


def test_train_stores_a_candidate_with_device_rows_then_gates_it(
        db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = ("train", "--db", db, "--candidate", "--max-rows", "300", "--seed", "1")
    code, out, _ = _run(capsys, *train, "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["kind"] == "CandidateBundle" and doc["version"] == 1
    # 300 of the 360 softmax rows, the same fraction from every GPU.
    assert doc["device_rows"] == {"a100-pcie-40gb": 100, "t4": 100, "v100-pcie-32gb": 100}
    with PerfStore.open(db) as store:
        (info,) = store.bundles()
        _, data = store.bundle(1)
    assert (info.state, info.rows) == ("candidate", 300)
    assert info.metrics["softmax"]["random_split"]["mape_pct"] > 0
    manifest = bundles.packed_manifest(data)
    assert manifest["device_rows"] == doc["device_rows"]
    assert "--candidate" in manifest["command"] and db.split("///")[1] in manifest["command"]

    code, out, _ = _run(capsys, "models", "promote", "1", "--db", db)
    assert code == 0 and "version 1: promoted: no active bundle to compare with" in out

    # The same rows and seed: an equal candidate, promoted by the gate.
    code, out, _ = _run(capsys, *train, "--promote", "-o", "json")
    assert code == 0, out
    decision = json.loads(out)
    assert decision["kind"] == "GateDecision" and decision["promote"] is True
    assert {c["measure"] for c in decision["checks"]} == {"random-split MAPE",
                                                          "leave-one-GPU-out MAPE"}
    assert decision["skipped"] and "job-outcome MAPE" in decision["skipped"][0]
    with PerfStore.open(db) as store:
        assert {b.version: b.state for b in store.bundles()} == {1: "retired", 2: "active"}

    # A worse candidate (softmax held-out MAPE 13 %, far above the fitted one): refused, exit 3,
    # it stays a candidate; --force activates it anyway.
    worse = tiny_bundle(tmp_path / "worse", seed=3)
    assert _run(capsys, "models", "add", str(worse), "--db", db)[0] == 0
    code, out, _ = _run(capsys, "models", "promote", "3", "--db", db)
    assert code == 3
    assert "version 3: refused: worse than the active bundle on random-split MAPE of softmax: " \
           "13.00 % vs active" in out
    assert "NO" in out
    with PerfStore.open(db) as store:
        assert store.active_version() == 2
        assert store.bundles()[2].state == "candidate"
        assert store.bundles()[2].reason.startswith(
            "refused by the promotion gate: worse than the active bundle on random-split MAPE")
        assert store.bundles()[1].reason.startswith("promotion gate: no worse")  # untouched
    # Why it was refused is in the listing and in `show` (issue #17).
    code, out, _ = _run(capsys, "models", "list", "--db", db)
    assert code == 0
    [row] = [line for line in out.splitlines() if line.split()[:2] == ["3", "candidate"]]
    assert "refused by the promotion gate: worse than the active bundle" in row
    code, out, _ = _run(capsys, "models", "show", "3", "--db", db)
    assert code == 0
    assert "reason:       refused by the promotion gate: worse than the active bundle on " \
           "random-split MAPE of softmax: 13.00 % vs active" in out
    code, out, _ = _run(capsys, "models", "promote", "3", "--db", db, "--force", "-o", "json")
    assert code == 0 and json.loads(out)["reason"] == "forced: the gate was skipped"
    with PerfStore.open(db) as store:
        assert store.active_version() == 3
        assert store.bundles()[2].reason == "promotion gate: forced: the gate was skipped"
    code, out, _ = _run(capsys, "models", "promote", "3", "--db", db)
    assert code == 3 and "already the active bundle" in out
    with PerfStore.open(db) as store:  # the active bundle keeps its activation's reason
        assert store.bundles()[2].reason == "promotion gate: forced: the gate was skipped"


def test_candidate_flags_need_a_database(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "train", "--data", "x.parquet", "--candidate")
    assert code == 2 and "--db" in err
    code, _, err = _run(capsys, "train", "--db", "sqlite://", "--promote")
    assert code == 2 and "--candidate" in err


def test_device_rows_count_only_kernels_the_bundle_learned() -> None:
    """A GPU whose only rows are of a kernel skipped for too few rows is not covered: coverage
    must not report rows the bundle learned nothing from (found by the loop test, #17)."""
    frame = synthetic_frame(120)
    frame = frame[frame["kernel"] == "softmax"]
    lone = synthetic_frame(40, keys=("l4",))
    lone = lone[lone["kernel"] == "gemm"]  # 40 gemm rows: below min_rows_per_kernel
    fitted = fitting.train_bundle(pd.concat([frame, lone], ignore_index=True),
                                  fitting.TrainSettings(max_rows_per_kernel=1000),
                                  validate=False)
    assert "gemm" in fitted.manifest["skipped_kernels"]
    assert fitted.manifest["device_rows"] == {"a100-pcie-40gb": 120, "t4": 120,
                                              "v100-pcie-32gb": 120}
