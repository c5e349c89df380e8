"""The kernel families the estimator prices: the one declaration of each (issue #31).

A layer lowers to work items (`core.workload.WorkItem`), each naming one kernel family; the
latency models are trained per family on bench rows of that family. Every table keyed by a
family (feature dims, bench builders and sweeps, backward derivers, backward-factor passes,
the matrix-unit set) is derived from `KERNEL_FAMILIES` or checked against it by
`tests/unit/estimator/test_kernel_registry.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from gpuplan_estimator.core.layers import OpFamily


@dataclass(frozen=True)
class KernelFamily:
    """One kernel family: its canonical dims and how the other stages treat it."""

    name: str
    dims: tuple[str, ...]
    """The dims a work item of this family carries, in feature order; a missing one is an
    error, never a silent 0."""
    op_family: OpFamily
    """The layer family whose kernels it prices (a layer's `OpFamily`)."""
    benched: bool
    """The micro-benchmark sweeps and builds it (`bench.sweep`, `bench.units`,
    `bench.torch_units`); an unbenched family is priced from its benched neighbours."""
    matrix: bool
    """Runs on matrix units (tensor cores, AMD MFMA) when its dtype has them."""
    backward_group: str
    """The group its measured backward/forward ratio is fitted in (`training.backward_factors`)."""
    backward_passes: float
    """Forward-kernel passes `step.backward` prices for its backward; elementwise is per op."""
    backward_measured: bool
    """A GPU's measured backward factor for its group scales the backward `step.backward`
    derives (`latency.learned.backward_factors`). True where the derivation prices a backward
    that runs other kernels (cuDNN's backward-data and backward-filter algorithms, batch norm's
    backward kernel, pooling's scatter) by forward-kernel stand-ins, and the bench draws
    shapes on the paths model layers take. Not for GEMMs (their backward is GEMMs the model
    prices at their own shapes); not for the row kernels, whose random bench widths mostly
    miss PyTorch's vectorised path that model widths take; not for copies, whose autograd
    backward in the bench is the gradient's layout copy, not a model's. The measured figures
    behind each choice are in docs/latency-method.md."""


_GRID = ("kernel_h", "kernel_w", "stride_h", "stride_w")

KERNEL_FAMILIES: Mapping[str, KernelFamily] = {f.name: f for f in (
    KernelFamily("gemm", ("batch", "m", "k", "n", "bias"), OpFamily.MATMUL,
                 benched=True, matrix=True, backward_group="matmul", backward_passes=2.0,
                 backward_measured=False),
    KernelFamily("conv2d", ("batch", "c_in", "c_out", "h", "w", *_GRID, "pad_h", "pad_w",
                            "dilation_h", "dilation_w", "groups"), OpFamily.CONV,
                 benched=True, matrix=True, backward_group="conv", backward_passes=2.0,
                 backward_measured=True),
    KernelFamily("pool", ("batch", "channels", "h", "w", *_GRID), OpFamily.POOLING,
                 benched=True, matrix=False, backward_group="pooling", backward_passes=1.0,
                 backward_measured=True),
    KernelFamily("layernorm", ("rows", "cols"), OpFamily.NORMALIZATION,
                 benched=True, matrix=False, backward_group="normalization",
                 backward_passes=2.0, backward_measured=False),
    # Its own backward group: the training-mode forward's statistics pass makes its ratio
    # unlike layernorm's.
    KernelFamily("batchnorm", ("rows", "cols"), OpFamily.NORMALIZATION,
                 benched=True, matrix=False, backward_group="batchnorm", backward_passes=1.0,
                 backward_measured=True),
    KernelFamily("softmax", ("rows", "cols"), OpFamily.SOFTMAX,
                 benched=True, matrix=False, backward_group="softmax", backward_passes=1.0,
                 backward_measured=False),
    KernelFamily("reduce", ("rows", "cols"), OpFamily.REDUCTION,
                 benched=False, matrix=False, backward_group="reduction", backward_passes=1.0,
                 backward_measured=False),
    KernelFamily("elementwise", ("rows", "cols", "operands"), OpFamily.ELEMENTWISE,
                 benched=True, matrix=False, backward_group="elementwise", backward_passes=1.0,
                 backward_measured=False),
    KernelFamily("memcpy", ("elements",), OpFamily.DATA_MOVEMENT,
                 benched=True, matrix=False, backward_group="data_movement",
                 backward_passes=1.0, backward_measured=False),
)}

KERNEL_NAMES: tuple[str, ...] = tuple(KERNEL_FAMILIES)
BENCHED_KERNELS: tuple[str, ...] = tuple(k for k, f in KERNEL_FAMILIES.items() if f.benched)
MATRIX_KERNELS: frozenset[str] = frozenset(k for k, f in KERNEL_FAMILIES.items() if f.matrix)


def kernel_dims() -> dict[str, tuple[str, ...]]:
    """Canonical dims per kernel family."""
    return {k: f.dims for k, f in KERNEL_FAMILIES.items()}

FREE_KERNEL = "none"
"""The kernel of an item that costs nothing at run time: a shape-only layer, or one the
framework folds into a neighbour's kernel. No model prices it; it is not a family."""

MIN_KERNEL_MS = 0.002
"""The shortest kernel on a stream: the H200 bench's graph-replayed tiny rows took 1.4-2.1 us
(`docs/gpu-steps/2026-11-27-h200b/bench.parquet`)."""
