"""A kernel over a batch is never slower than two launches over its halves (issue #30).

A convolution's rows in the shared data are 3x3, stride 1, batch at most 64; the H200's bench
rows are small. Past them a learned model's efficiency can fall as the batch grows, which no
GPU does: a batch can always run as two launches of half of it. ResNet-50's 1x1 convolutions
at batch 128 priced at 15 TFLOP/s in tf32 where batch 8 priced at 47, so its inference forward
came out 46 % slow on the H200 (run 1, held out).

The bound is recursive: a batch's price is at most twice its half's bounded price
(``ceil(batch / 2)``, so the halves cover an odd batch), down to batch 1. It only ever lowers a
price, keeps each interval's width relative to its median, and changes nothing where the model
already grows at most linearly with the batch. It holds for convolutions (`SPLIT_KERNELS`),
whose batch dim is what the sweeps extrapolate; a GEMM's batch and m are priced by the
aligned-GEMM plan or the tile-and-wave transfer model, which already scale with them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core.layers import DTYPE_BYTES
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost.predictors import FloatArray
from gpuplan_estimator.step import backward

SPLIT_KERNELS = frozenset({"conv2d"})
"""Kernels whose price is bounded by their halves'."""
HALVES = 2
"""A batch runs as this many launches of its half."""


def halves(items: Sequence[WorkItem]) -> tuple[npt.NDArray[np.intp], list[WorkItem]]:
    """The rows of `items` that a half-batch launch bounds (`SPLIT_KERNELS`, batch >= 2), and
    each one's half: the same work at ``ceil(batch / 2)``, counted once."""
    rows: list[int] = []
    pieces: list[WorkItem] = []
    for i, item in enumerate(items):
        batch = int(item.dims.get("batch", 1))
        if item.kernel not in SPLIT_KERNELS or batch < 2:
            continue
        dims = dict(item.dims) | {"batch": -(-batch // HALVES)}
        flops, moved = backward.kernel_cost(item.kernel, dims, DTYPE_BYTES[item.dtype])
        pieces.append(replace(item, dims=MappingProxyType(dims), flops=flops,
                              bytes_moved=moved, count=1))
        rows.append(i)
    return np.asarray(rows, dtype=np.intp), pieces


def bounded(parts: tuple[FloatArray, FloatArray, FloatArray], rows: npt.NDArray[np.intp],
            half_median_ms: FloatArray) -> None:
    """Lower each of `rows`' (median, P10, P90) in place where `HALVES` launches of its half
    (`half_median_ms`, one launch each) take less, keeping the interval's relative width."""
    median = parts[0]
    bound = HALVES * np.asarray(half_median_ms, dtype=np.float64)
    scale = np.where(bound < median[rows], bound / np.maximum(median[rows], 1e-300), 1.0)
    for values in parts:
        values[rows] *= scale
