"""A kernel over a batch is never slower than two launches over its halves (issue #30).

A convolution's rows in the shared data are 3x3, stride 1, batch at most 64; the H200's bench
rows are small. Past them a learned model's efficiency can fall as the batch grows, which no
GPU does: a batch can always run as two launches of half of it. ResNet-50's 1x1 convolutions
at batch 128 priced at 15 TFLOP/s in tf32 where batch 8 priced at 47, so its inference forward
came out 46 % slow on the H200 (run 1, held out).

The bound is recursive: a batch's price is at most twice its half's bounded price
(``ceil(batch / 2)``, so the halves cover an odd batch), down to `MIN_HALF_BATCH`. It only ever
lowers a price, keeps each interval's width relative to its median, and changes nothing where
the model already grows at most linearly with the batch. It holds for convolutions
(`SPLIT_KERNELS`), whose batch dim is what the sweeps extrapolate; a GEMM's batch and m are
priced by the aligned-GEMM plan or the tile-and-wave transfer model, which already scale with
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from gpuplan_estimator.core.layers import DTYPE_BYTES
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost.predictors import FloatArray
from gpuplan_estimator.step import backward

SPLIT_KERNELS = frozenset({"conv2d"})
"""Kernels whose price is bounded by their halves'."""
HALVES = 2
"""A batch runs as this many launches of its half."""
MIN_HALF_BATCH = 8
"""The smallest half a chain prices: a convolution of fewer samples fills a fraction of a
data-centre GPU, so its doubled price barely undercuts a larger batch's (the shipped bundle's
ResNet-50 training steps on six GPUs, batch 8 to 256, fp32, tf32 and bf16: 50 of 56 the same
as with halves down to 1, the others within 0.4 %), and each level is one more row per
convolution and device to price."""


@dataclass(frozen=True)
class HalvingChains:
    """The items a half-batch launch bounds, and each one's halves down to `MIN_HALF_BATCH`."""

    rows: tuple[int, ...]
    """Positions of the bounded items (`SPLIT_KERNELS`, batch >= 2 x `MIN_HALF_BATCH`)."""
    chains: tuple[tuple[int, int], ...]
    """Per row, (start, end) of its halves in `pieces`, largest batch first."""
    pieces: tuple[WorkItem, ...]
    """Each halving: the same work at ``ceil(batch / 2)`` of the one before, counted once."""


def halving_chains(items: Sequence[WorkItem]) -> HalvingChains:
    """Every convolution of at least twice `MIN_HALF_BATCH` samples, with its chain of halves
    down to `MIN_HALF_BATCH` (..., 16 -> 8; 17 -> 9)."""
    rows: list[int] = []
    chains: list[tuple[int, int]] = []
    pieces: list[WorkItem] = []
    for i, item in enumerate(items):
        batch = int(item.dims.get("batch", 1))
        if item.kernel not in SPLIT_KERNELS or batch < HALVES * MIN_HALF_BATCH:
            continue
        start = len(pieces)
        while batch >= HALVES * MIN_HALF_BATCH:
            batch = -(-batch // HALVES)
            dims = dict(item.dims) | {"batch": batch}
            flops, moved = backward.kernel_cost(item.kernel, dims, DTYPE_BYTES[item.dtype])
            pieces.append(replace(item, dims=MappingProxyType(dims), flops=flops,
                                  bytes_moved=moved, count=1))
        rows.append(i)
        chains.append((start, len(pieces)))
    return HalvingChains(tuple(rows), tuple(chains), tuple(pieces))


def bounded(parts: tuple[FloatArray, FloatArray, FloatArray], chains: HalvingChains,
            piece_median_ms: FloatArray) -> None:
    """Lower each chained row's (median, P10, P90) in place where `HALVES` launches of its
    half take less, the half's own price bounded the same way from the smallest batch up
    (`piece_median_ms`: the model's price of each piece); the interval keeps its relative
    width."""
    median = parts[0]
    for row, (start, end) in zip(chains.rows, chains.chains, strict=True):
        bound = float(piece_median_ms[end - 1])
        for j in range(end - 2, start - 1, -1):
            bound = min(float(piece_median_ms[j]), HALVES * bound)
        bound *= HALVES
        if bound < median[row]:
            scale = bound / median[row]
            for values in parts:
                values[row] *= scale
