"""Pure: elementwise kernels that convert dtypes element by element, priced by the SMs' rate.

PyTorch's TensorIterator vectorises an elementwise kernel only when every operand has the
output's dtype (fp32-to-half copies have vectorised kernels of their own). An upcast, or an op
over a half and an fp32 operand (autocast's half GEMM output added to the fp32 residual
stream), runs `unrolled_elementwise_kernel`, which loads, converts and stores one element at a
time: it is bound by the SMs' issue rate, not by memory bandwidth. The benchmarks time same-dtype
kernels only, so a model learned on them prices these at the vectorised kernels' bandwidth.

On the H200's profiled bf16 steps (`docs/gpu-steps/2026-11-27-h200b/steps.jsonl`, run 2: GPT-2
small and medium, BERT-base) those kernels moved 0.87-1.07 elements per SM-cycle at the boost
clock in each model and phase, from 1.6 M to 103 M elements a kernel, where the vectorised
kernels beside them came near the memory bandwidth (`docs/host-timeline.md`, "Casting element
by element"). So a marked item (`workload.DYNAMIC_CAST`) costs at least its elements at
`ELEMENTS_PER_SM_CYCLE` over the device's SMs; a GPU whose memory is the slower bound keeps its
learned price. This is PyTorch 2.11's behaviour, the measured runs' version; later sources copy
bf16 and fp16 up to fp32 with vectorised kernels too, which leaves only the mixed-dtype ops
unrolled (`step.autocast` marks upcasts as 2.11 runs them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core.workload import DYNAMIC_CAST, WorkItem
from gpuplan_estimator.devices.catalog import DeviceSpec

FloatArray = npt.NDArray[np.float64]
ELEMENTS_PER_SM_CYCLE = 1.0
"""Elements an unrolled dtype-converting kernel moves per SM per cycle: the H200 profiles above
pooled read 1.03, and 1.00-1.05 with any one of the three models left out."""
UNROLLED_VENDORS = frozenset({"nvidia"})
"""Where the floor applies: PyTorch's CUDA build, as profiled. Its ROCm build already copied
bf16 and fp16 up to fp32 with vectorised kernels in 2.11, and no AMD GPU has been profiled; a
CPU runs ATen's vectorised loops."""


def item_elements(item: WorkItem) -> int:
    """Elements an elementwise item writes (its rows times columns)."""
    return int(item.dims.get("rows", 1)) * int(item.dims.get("cols", 1))


def floor_ms(items: Sequence[WorkItem], device: DeviceSpec) -> FloatArray:
    """Per item, the least time (ms) one run of it takes on `device`: its elements at the SMs'
    unrolled rate for a dtype-converting elementwise kernel, 0 for any other item or device."""
    out = np.zeros(len(items))
    if device.vendor not in UNROLLED_VENDORS:
        return out
    per_ms = ELEMENTS_PER_SM_CYCLE * device.sm_count * device.boost_clock_mhz * 1e3
    for i, item in enumerate(items):
        if item.attributes.get(DYNAMIC_CAST):
            out[i] = item_elements(item) / per_ms
    return out


def floored(items: Sequence[WorkItem], device: DeviceSpec, median_ms: FloatArray,
            *quantiles_ms: FloatArray) -> list[FloatArray]:
    """`median_ms` with each item at least its `floor_ms`, and each of `quantiles_ms` scaled by
    the same factor (the interval keeps its width relative to the median)."""
    floor = floor_ms(items, device)
    factor = np.where(floor > median_ms, floor / np.maximum(median_ms, 1e-12), 1.0)
    return [median_ms * factor, *(q * factor for q in quantiles_ms)]
