"""The shipped bundle's recipe: where its rows come from and the LightGBM parameters per kernel.

Why these sizes: see `docs/latency-method.md` (held-out errors per size, with the commands).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuplan_estimator.core import errors, paths

CPU_MEASUREMENTS = paths.PACKAGE_DATA_DIR / "cpu-measurements"
SHIPPED_MAX_ROWS = 60_000
# Sized so the shipped bundle stays under 20 MB (gzip-compressed model text): GEMM and conv
# need deeper trees (held-out MAPE 10.7 -> 7.4 % for gemm, 15 -> 10 % for conv2d going from
# 200x31 to 400x95 leaves); learning rate 0.1 instead of 0.05 at the same size: gemm 7.31 ->
# 6.99 %. conv2d keeps improving with more trees (random split, seed 0: 400 at lr 0.1 9.48 %,
# P90 20.9 %; 1500 at lr 0.05 8.96 %; 3000 at lr 0.05 8.87 %, P90 19.4 %), which the
# compression pays for (its median model is ~29 MB of text, ~10 MB gzipped). The transfer
# models see fewer features and stay small.
KERNEL_PARAMS: dict[str, dict[str, Any]] = {
    "gemm": {"n_estimators": 400, "num_leaves": 95, "min_child_samples": 5,
             "learning_rate": 0.1, "quantile_n_estimators": 50},
    "conv2d": {"n_estimators": 3000, "num_leaves": 95, "min_child_samples": 5,
               "learning_rate": 0.05, "quantile_n_estimators": 50},
}
TRANSFER_PARAMS: dict[str, Any] = {"n_estimators": 150, "quantile_n_estimators": 60}
# CPU models see 1-4k rows per kernel; 600-1000 trees did no better than 200 there (the scatter
# is between benchmark sessions), so they stay small and the bundle under 20 MB.
CPU_PARAMS: dict[str, Any] = {"n_estimators": 150, "num_leaves": 15,
                              "quantile_n_estimators": 50}


def shared_data_dir() -> Path:
    """``$GPUPLAN_SHARED_DATA``, else ``../shared/data`` beside the source checkout."""
    return Path(os.environ.get("GPUPLAN_SHARED_DATA") or paths.REPO_ROOT.parent / "shared" / "data")


def shipped_sources() -> list[str]:
    """The measurement sources the shipped bundle is trained from: shared GPU rows + CPU rows."""
    gpu = shared_data_dir() / "gpu-ops"
    if not gpu.is_dir():
        raise errors.InvalidRequestError(
            "GPUPLAN_SHARED_DATA", f"{gpu} is not a directory; point $GPUPLAN_SHARED_DATA at it")
    out = [str(gpu)]
    if CPU_MEASUREMENTS.is_dir() and any(CPU_MEASUREMENTS.glob("*.parquet")):
        out.append(str(CPU_MEASUREMENTS))
    return out
