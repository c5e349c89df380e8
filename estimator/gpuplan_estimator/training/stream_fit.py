"""Fit the tensor-core GEMM utilisations on profiled whole-model steps (issue #30).

`cost.aligned_gemm` prices the tensor-core GEMMs the kernel benchmarks do not describe as their
tile-and-wave plan over a utilisation per kernel class (`tiling.tensor_core_class`). A profiled
step (`evaluation.model_steps --instrument`) names each kernel it ran; the GEMM kernels of one
class (`kernel_class`: from the name's CUTLASS alignment) took `profiled_ms` of one phase, and
the same phase's GEMM items of that class that the module prices have plans summing to
`plan_ms`. Per class, the log utilisation is the median of log(plan_ms / profiled_ms) over the
phases, and per class and phase (forward, backward) over that phase's; `leave_one_group_out`
refits without each model in turn, and the spread of the left-out model's ratios around its
fold is the `log_sigma` a bundle's intervals use.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from gpuplan_estimator.core.layers import DTYPE_BYTES
from gpuplan_estimator.cost import tiling
from gpuplan_estimator.cost.aligned_gemm import AlignedGemmFit, phase_key

GEMM_KERNEL = re.compile(r"gemm|nvjet|xmma", re.IGNORECASE)
"""cuBLAS/CUTLASS GEMM kernel names: `nvjet_sm90_*`, `sm90_xmma_gemm_*`, `cutlass_*gemm*`."""
ATTENTION_KERNEL = re.compile(r"fmha|sdpa|flash|attention", re.IGNORECASE)
"""Fused attention kernels, whose GEMMs run inside them (priced with the attention core)."""
ALIGNMENT = re.compile(r"_align(\d+)")
"""CUTLASS names carry their operands' alignment in elements (`..._tn_align1`); cuBLAS's
Hopper kernels (`nvjet`, `sm90_xmma`) run aligned operands only."""


@dataclass(frozen=True)
class AlignedRow:
    """One profiled phase and kernel class: its GEMMs' plan time against their kernels'."""

    group: str  # the model: what leave-one-out leaves out
    kernel_class: str  # tiling.tensor_core_class
    phase: str
    plan_ms: float
    profiled_ms: float

    @property
    def log_ratio(self) -> float:
        """log(plan / profiled): the utilisation this phase's GEMMs of the class reached."""
        return math.log(self.plan_ms / self.profiled_ms)


def kernel_class(name: str, mode: str, dtype: str) -> str | None:
    """The tensor-core class (`tiling.tensor_core_class`) of a profiled kernel run in `mode`
    on `dtype` operands; None for a kernel that is no GEMM or runs inside fused attention."""
    if not GEMM_KERNEL.search(name) or ATTENTION_KERNEL.search(name):
        return None
    found = ALIGNMENT.search(name)
    width = DTYPE_BYTES[dtype]
    elements = int(found.group(1)) if found else tiling.TENSOR_CORE_ALIGN_BYTES // width
    return tiling.tensor_core_class(mode, min(elements, tiling.TENSOR_CORE_ALIGN_BYTES // width),
                                    width)


def fit(rows: Sequence[AlignedRow]) -> AlignedGemmFit:
    """Per class, and per class and phase (`aligned_gemm.phase_key`), the median log
    utilisation of `rows` (ValueError without a usable row)."""
    usable = [r for r in rows if r.plan_ms > 0 and r.profiled_ms > 0]
    if not usable:
        raise ValueError("no profiled phase with aligned tensor-core GEMMs to fit on")
    by_key: dict[str, list[float]] = {}
    for r in usable:
        by_key.setdefault(r.kernel_class, []).append(r.log_ratio)
        by_key.setdefault(phase_key(r.kernel_class, r.phase), []).append(r.log_ratio)
    log_util = {key: float(np.median(v)) for key, v in sorted(by_key.items())}
    return AlignedGemmFit(log_util, _spread(usable, {"": AlignedGemmFit(log_util)}))


def _spread(rows: Sequence[AlignedRow], folds: Mapping[str, AlignedGemmFit]) -> float:
    """RMS of each row's log ratio around its fold's (`""`: one fit for every group)."""
    none = AlignedGemmFit()
    errors = [r.log_ratio - folds.get(r.group, folds.get("", none)).log_util_of(r.kernel_class,
                                                                                r.phase)
              for r in rows if r.plan_ms > 0 and r.profiled_ms > 0]
    errors = [e for e in errors if math.isfinite(e)]
    return float(np.sqrt(np.mean(np.square(errors)))) if errors else 0.0


def leave_one_group_out(rows: Sequence[AlignedRow]) -> dict[str, AlignedGemmFit]:
    """Per group (model): the fit on every other group's rows (groups whose others hold no
    usable row are left out)."""
    out = {}
    for group in sorted({r.group for r in rows}):
        others = [r for r in rows if r.group != group]
        try:
            out[group] = fit(others)
        except ValueError:
            continue
    return out


def fit_for_bundle(rows: Sequence[AlignedRow]) -> AlignedGemmFit:
    """The fit on every row, with the held-out (leave-one-model-out) spread as `log_sigma`."""
    folds = leave_one_group_out(rows)
    held_out = _spread([r for r in rows if r.group in folds], folds)
    return AlignedGemmFit(fit(rows).log_util, held_out)
