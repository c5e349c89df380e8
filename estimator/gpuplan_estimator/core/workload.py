"""Work items: the device-independent unit every latency predictor prices.

A training step is a list of work items: the forward layers, the backward work derived from
them as forward-shaped kernels (a MatMul's dX and dW are MatMuls), and the optimizer's
elementwise passes. Predictors (roofline, LightGBM) map work items to milliseconds per device.

Canonical `dims` per kernel (all ints; what benchmark rows and inference share):

- ``gemm``: ``batch, m, k, n`` — ``[batch, m, k] @ [batch, k, n]``; ``k`` is the contraction.
  ``bias`` is 1 when a bias add is fused (nn.Linear), else 0.
- ``conv2d``: ``batch, c_in, c_out, h, w, kernel_h, kernel_w, stride_h, stride_w, pad_h,
  pad_w, dilation_h, dilation_w, groups`` (``h, w`` = input spatial size).
  1-D convs use h=1; 3-D convs fold depth into ``h`` (an approximation listed in the notes).
- ``pool``: ``batch, channels, h, w, kernel_h, kernel_w, stride_h, stride_w``.
- ``layernorm`` / ``batchnorm`` / ``softmax`` / ``reduce``: ``rows, cols`` (normalise over cols).
- ``elementwise``: ``rows, cols, operands`` plus ``op`` in `WorkItem.op`
  (add, mul, div, pow, relu, gelu, tanh, sigmoid, ...).
- ``memcpy`` (data movement, embedding gathers): ``elements``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuplan_estimator.core.layers import OpFamily, TensorInfo

FUSED_IO_BYTES = "fused_io_bytes"
"""`WorkItem.attributes` key: the bytes the item moves when it runs inside a fused kernel that
keeps an operand on chip (a fused attention's [queries, keys] scores), below `bytes_moved`.
Predictors price it at the same efficiency against its own roofline as the unfused kernel."""
DYNAMIC_CAST = "dynamic_cast"
"""`WorkItem.attributes` key, set to 1: an elementwise kernel that converts dtypes element by
element (an upcast, or a binary op over operands of two dtypes under autocast), which PyTorch's
TensorIterator runs unvectorised (`cost.unrolled`)."""


class Phase(str, enum.Enum):
    """Where in a step a work item runs."""

    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


@dataclass(frozen=True)
class WorkItem:
    """One kernel-shaped piece of work, priced once and counted `count` times."""

    layer: str  # layer name it came from ("optimizer" for optimizer passes)
    family: OpFamily
    kernel: str  # gemm conv2d pool layernorm batchnorm softmax reduce elementwise memcpy none
    phase: Phase
    dims: Mapping[str, int]
    dtype: str  # compute dtype, key of layers.DTYPE_BYTES
    flops: int
    bytes_moved: int
    op: str = ""  # elementwise op name, or the ONNX op type for others
    count: int = 1
    role: str = ""  # e.g. "dgrad", "wgrad", "fwd", "adam_update"
    attributes: Mapping[str, int | float | str] = field(default_factory=dict)


GRADIENT_OP_SUFFIX = "_grad"
"""An elementwise gradient item's op is its forward op's with this suffix ("relu_grad")."""


def elementwise_dims(out: TensorInfo, operands: int) -> dict[str, int]:
    """Rows and last-axis columns of `out`, as an elementwise kernel over it sees them."""
    cols = out.shape[-1] if out.shape else 1
    return {"rows": out.elements // max(cols, 1), "cols": cols, "operands": operands}
