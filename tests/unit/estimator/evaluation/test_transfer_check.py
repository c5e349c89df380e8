"""Leave-one-GPU-out of the transfer structures, on op rows of real catalog GPUs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import measurements
from gpuplan_estimator.core.exit_codes import ExitCode
from gpuplan_estimator.cost import features
from gpuplan_estimator.evaluation import transfer_check
from gpuplan_estimator.interfaces.cli import main as cli
from gpuplan_estimator.training import fitting

GPUS = ("t4", "v100-pcie-32gb", "a100-pcie-40gb")


def gemm_frame(rows_per_gpu: int = 150) -> pd.DataFrame:
    """gemm rows whose latency is 1/0.7 of the tile-and-wave time plus the launch floor: a
    utilisation every GPU shares, which the tiled transfer model should carry to a left-out one."""
    rng = np.random.default_rng(0)
    catalog = devices.load_catalog()
    out = []
    for key in GPUS:
        m, k, n = (rng.integers(16, 4096, rows_per_gpu) for _ in range(3))
        dims = {"batch": np.ones_like(m), "m": m, "k": k, "n": n, "bias": np.zeros_like(m)}
        dtype = np.full(rows_per_gpu, "float32")
        cols = features.WorkColumns("gemm", dims, dtype, np.full(rows_per_gpu, "gemm"))
        dev = features.broadcast_device(catalog.resolve(key), dtype, 0)
        x, base = features.feature_matrix(cols, dev)
        _, structure_ms = features.transfer_matrix(cols, dev, x, base, "tiled")
        out.append(pd.DataFrame({
            "device": key, "backend": "pytorch-2.1.0+cu121", "kernel": "gemm", "op": "gemm",
            "dtype": "float32",
            "dims": [measurements.dims_to_json({d: int(v[i]) for d, v in dims.items()})
                     for i in range(rows_per_gpu)],
            "latency_ms": structure_ms / 0.7, "latency_std_ms": np.nan, "repeats": 25,
            "source": "synth"}))
    return pd.concat(out, ignore_index=True)


def test_the_tiled_structure_carries_a_shared_utilisation_to_a_left_out_gpu() -> None:
    frame = gemm_frame()
    fast = {"n_estimators": 40, "num_leaves": 15, "min_child_samples": 5, "n_jobs": 1}
    tiled = transfer_check.op_logo(frame, "gemm", fitting.TrainSettings(
        model_params=fast, transfer_kind="tiled", min_rows_per_kernel=50))
    roofline = transfer_check.op_logo(frame, "gemm", fitting.TrainSettings(
        model_params=fast, transfer_kind="roofline", min_rows_per_kernel=50))
    assert set(tiled) == set(roofline) == set(GPUS)
    assert max(tiled.values()) < 3.0
    assert np.mean(list(tiled.values())) < np.mean(list(roofline.values()))
    table = transfer_check.op_table({"gemm": tiled})
    assert table.splitlines()[0].startswith("| kernel | a100-pcie-40gb | t4 |")
    assert table.splitlines()[2].startswith("| gemm | ")


@pytest.mark.parametrize("argv", [["--kind", "magic"]])
def test_cli_refuses_an_unknown_kind(argv: list[str]) -> None:
    assert cli.main(["eval", "transfer-check", *argv]) == ExitCode.USAGE
