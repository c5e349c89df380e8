"""Pure derivation of a layer's backward work as forward-shaped kernels.

The rules, per forward kernel (``grads[i]`` says whether input ``i`` needs a gradient):

- ``gemm`` Y = A·B: dA = dY·Bᵀ and dB = Aᵀ·dY, each a gemm, each only when that operand needs a
  gradient. A parameter operand is shared across the batch, so its gradient contracts over the
  batch too (``batch=1, k=batch*m``). A Gemm bias gradient is a column sum (``reduce``).
- ``conv2d``: dgrad is the transposed conv, priced as a conv2d with ``c_in``/``c_out`` swapped
  on the output grid (stride 1, same padding: the same FLOPs as forward); wgrad is a conv2d with
  the forward dims; a bias gradient is a reduce over batch and pixels.
- ``layernorm``: twice the forward normalisation kernel (dX, then dγ/dβ).
- ``batchnorm``: the forward kernel again: training-mode BN makes two passes forward (statistics,
  normalise) and two backward (dγ/dβ reduction, dX). PyTorch on CPU measures less, 0.5-0.7x
  the forward (torch bench rows; DenseNet-121's SGD step at batch 8).
- ``softmax``: one softmax-shaped pass (dX = Y·(dY − Σ dY·Y)) reading Y and dY.
- ``pool``: the pooling kernel again (scatter of dY into the input grid).
- ``elementwise``: Add passes dY through for free (a reduce when an input was broadcast); Sub
  negates the second operand; Mul/Div and other binaries one pass per operand needing a
  gradient; unary activations one pass reading dY and X. Under autocast, a pass reading an
  operand of another dtype than dY runs unrolled, and a half operand's gradient (computed at
  the output's fp32) is cast back to half (`autocast.gradient_cast`). A Concat's input
  gradients are slices of dY (views, no kernel). LRN's gradient sums over the same channel
  window: the LRN kernel again (in PyTorch, whose LRN is avg_pool3d plus pointwise ops, the
  backward measures 1.0-1.2x the forward: torch bench rows, ZFNet-512's SGD step at batch 8).
- ``reduce``: one broadcasting elementwise pass over the input.
- ``memcpy``: the same copy; an embedding's table gradient is a zeroed table plus a scatter-add
  of the gathered rows (PyTorch's dense `embedding_backward`).
- any other kernel: the forward item again.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

from gpuplan_estimator.core import precisions
from gpuplan_estimator.core.layers import DTYPE_BYTES, Layer, OpFamily
from gpuplan_estimator.core.workload import GRADIENT_OP_SUFFIX, Phase, WorkItem
from gpuplan_estimator.step import autocast, eager

DGRAD, WGRAD, BGRAD, SCATTER_ADD = "dgrad", "wgrad", "bgrad", "scatter_add"
DERIVED_ROLES = frozenset({DGRAD, WGRAD, BGRAD, SCATTER_ADD})
"""The roles of the items `backward_items` derives: a device's measured backward factors
(`core.kernels.KernelFamily.backward_measured`) scale these and no other backward work."""
PASS_THROUGH_OPS = frozenset({"Add", "Sum"})
VIEW_GRADIENT_OPS = frozenset({"Concat"})
WINDOW_OPS = frozenset({"LRN"})
NEGATING_OPS = frozenset({"Sub"})


def op_name(layer: Layer) -> str:
    """Elementwise items carry the lower-case op name (add, relu, ...); others the ONNX op type."""
    if layer.family is OpFamily.ELEMENTWISE:
        return layer.op_type.lower()
    return layer.op_type


def math_attributes(kernel: str, precision: str) -> Mapping[str, str]:
    """TF32 keeps float32 tensors but runs gemm/conv on tensor cores: tell the predictor
    (`core.precisions`: matmuls under "tf32", convolutions under every precision's defaults)."""
    entry = precisions.precision(precision)
    math = "" if entry.autocast else entry.math_of(kernel)  # autocast lowers them to 16 bit
    return MappingProxyType({"math": math} if math else {})


def backward_items(
    layer: Layer, fwd: WorkItem, grads: Sequence[bool], precision: str,
    dtypes: Mapping[str, str] = MappingProxyType({}),
) -> list[WorkItem]:
    """Backward work items of one layer whose forward item is `fwd`; `dtypes` holds the
    run-time dtypes under autocast (`autocast.tensor_dtypes`), which an elementwise layer over
    operands of two dtypes needs (`_elementwise`)."""
    if fwd.kernel == "elementwise":
        return _elementwise(layer, fwd, tuple(grads), precision, dtypes)
    derive = _DERIVERS.get(fwd.kernel, _same_as_forward)
    return derive(layer, fwd, tuple(grads), precision)


def _item(
    fwd: WorkItem, kernel: str, dims: Mapping[str, int], role: str, precision: str, *,
    op: str | None = None, family: OpFamily | None = None, count: int = 1,
) -> WorkItem:
    flops, moved = kernel_cost(kernel, dims, DTYPE_BYTES[fwd.dtype])
    return WorkItem(
        layer=fwd.layer,
        family=family if family is not None else fwd.family,
        kernel=kernel,
        phase=Phase.BACKWARD,
        dims=MappingProxyType(dict(dims)),
        dtype=fwd.dtype,
        flops=flops,
        bytes_moved=moved,
        op=op if op is not None else fwd.op,
        count=count,
        role=role,
        attributes=math_attributes(kernel, precision),
    )


def kernel_cost(kernel: str, dims: Mapping[str, int], width: int) -> tuple[int, int]:
    """(flops, bytes moved) of a derived kernel from its canonical dims."""
    if kernel == "gemm":
        b, m, k, n = dims["batch"], dims["m"], dims["k"], dims["n"]
        return 2 * b * m * k * n, width * b * (m * k + k * n + m * n)
    if kernel == "conv2d":
        oh, ow = conv_output_hw(dims)
        b, ci, co, g = dims["batch"], dims["c_in"], dims["c_out"], dims["groups"]
        taps = ci // g * dims["kernel_h"] * dims["kernel_w"]
        flops = 2 * b * co * oh * ow * taps
        return flops, width * (b * ci * dims["h"] * dims["w"] + co * taps + b * co * oh * ow)
    if kernel == "reduce":
        return dims["rows"] * dims["cols"], width * (dims["rows"] * dims["cols"] + dims["rows"])
    if kernel == "elementwise":
        n = dims["rows"] * dims["cols"]
        return n, width * n * (dims["operands"] + 1)
    if kernel == "memcpy":
        return 0, 2 * width * dims["elements"]
    raise ValueError(f"kernel_cost: no cost rule for kernel {kernel!r}")


def conv_output_hw(dims: Mapping[str, int]) -> tuple[int, int]:
    """Output (height, width) of a 2-D convolution from canonical dims, each at least 1."""
    def out(size: int, k: int, s: int, p: int, d: int) -> int:
        return max(1, (size + 2 * p - d * (k - 1) - 1) // s + 1)

    return (
        out(dims["h"], dims["kernel_h"], dims["stride_h"], dims["pad_h"], dims["dilation_h"]),
        out(dims["w"], dims["kernel_w"], dims["stride_w"], dims["pad_w"], dims["dilation_w"]),
    )


def _gemm(layer: Layer, fwd: WorkItem, grads: tuple[bool, ...], precision: str) -> list[WorkItem]:
    d = fwd.dims
    b, m, k, n = d["batch"], d["m"], d["k"], d["n"]
    params = set(layer.parameter_inputs)
    names = [t.name for t in layer.inputs]
    items = []
    if grads[0]:
        a_param = names[0] in params
        dims = {"batch": 1, "m": m, "k": b * n, "n": k} if a_param and b > 1 else {
            "batch": b, "m": m, "k": n, "n": k}
        items.append(_item(fwd, "gemm", dims | {"bias": 0}, WGRAD if a_param else DGRAD,
                           precision))
    if len(grads) > 1 and grads[1]:
        b_param = names[1] in params
        dims = {"batch": 1, "m": k, "k": b * m, "n": n} if b_param else {
            "batch": b, "m": k, "k": m, "n": n}
        items.append(_item(fwd, "gemm", dims | {"bias": 0}, WGRAD if b_param else DGRAD,
                           precision))
    if len(grads) > 2 and grads[2]:
        items.append(_bias_reduce(fwd, rows=n, cols=b * m, precision=precision))
    return items


def _conv(layer: Layer, fwd: WorkItem, grads: tuple[bool, ...], precision: str) -> list[WorkItem]:
    d = dict(fwd.dims)
    if d.get("transposed"):  # ConvTranspose: its dgrad is a plain conv of the same size
        items = [replace(fwd, phase=Phase.BACKWARD, role=DGRAD)] if grads[0] else []
        if len(grads) > 1 and grads[1]:
            items.append(replace(fwd, phase=Phase.BACKWARD, role=WGRAD))
        return items
    oh, ow = conv_output_hw(d)
    items = []
    if grads[0]:
        dgrad = d | {
            "c_in": d["c_out"], "c_out": d["c_in"], "h": oh, "w": ow, "stride_h": 1,
            "stride_w": 1, "pad_h": d["dilation_h"] * (d["kernel_h"] - 1) // 2,
            "pad_w": d["dilation_w"] * (d["kernel_w"] - 1) // 2,
        }
        items.append(_item(fwd, "conv2d", dgrad, DGRAD, precision))
    if len(grads) > 1 and grads[1]:
        items.append(_item(fwd, "conv2d", d, WGRAD, precision))
    if len(grads) > 2 and grads[2]:
        items.append(_bias_reduce(fwd, rows=d["c_out"], cols=d["batch"] * oh * ow,
                                  precision=precision))
    return items


def _bias_reduce(fwd: WorkItem, *, rows: int, cols: int, precision: str) -> WorkItem:
    return _item(fwd, "reduce", {"rows": rows, "cols": cols}, BGRAD, precision,
                 op="ReduceSum", family=OpFamily.REDUCTION)


def _norm(layer: Layer, fwd: WorkItem, grads: tuple[bool, ...], precision: str) -> list[WorkItem]:
    return [replace(fwd, phase=Phase.BACKWARD, role=DGRAD, count=2 * fwd.count)]


def _softmax(
    layer: Layer, fwd: WorkItem, grads: tuple[bool, ...], precision: str
) -> list[WorkItem]:
    # Reads Y and dY, writes dX: half as much traffic again as the forward pass.
    moved = fwd.bytes_moved * 3 // 2
    return [replace(fwd, phase=Phase.BACKWARD, role=DGRAD, bytes_moved=moved)]


def _same_as_forward(
    layer: Layer, fwd: WorkItem, grads: tuple[bool, ...], precision: str
) -> list[WorkItem]:
    return [replace(fwd, phase=Phase.BACKWARD, role=DGRAD)]


def _memcpy(layer: Layer, fwd: WorkItem, grads: tuple[bool, ...], precision: str) -> list[WorkItem]:
    if layer.family is not OpFamily.EMBEDDING:
        return _same_as_forward(layer, fwd, grads, precision)
    table_elements = layer.parameter_count or (layer.inputs[0].elements if layer.inputs else 0)
    items = [replace(fwd, phase=Phase.BACKWARD, role=SCATTER_ADD, op="ScatterAdd")]
    if table_elements:
        # A fill, written once at the memory's speed: an elementwise kernel with no operand.
        # Priced as the transposing memcpy benchmark, GPT-2 small's 38.6M-element table read
        # 1.0 ms on the H200, whose profile shows 0.12 ms for all four of its backward fills.
        cols = layer.inputs[0].shape[-1] if layer.inputs and layer.inputs[0].shape else 1
        zero = _item(fwd, "elementwise", {"rows": table_elements // max(cols, 1),
                                          "cols": cols, "operands": 0},
                     "grad_zero", precision, op="Memset", family=OpFamily.ELEMENTWISE)
        items.insert(0, zero)
    return items


def _elementwise_shape(fwd: WorkItem, layer: Layer) -> tuple[int, int]:
    if "rows" in fwd.dims and "cols" in fwd.dims:
        return fwd.dims["rows"], fwd.dims["cols"]
    return 1, max((t.elements for t in layer.outputs), default=1)


def _elementwise(
    layer: Layer, fwd: WorkItem, grads: tuple[bool, ...], precision: str,
    dtypes: Mapping[str, str] = MappingProxyType({}),
) -> list[WorkItem]:
    if layer.op_type in VIEW_GRADIENT_OPS:
        return []
    if layer.op_type in WINDOW_OPS or layer.op_type in eager.CLONE_OPS:
        return _same_as_forward(layer, fwd, grads, precision)  # LRN again; a clone's copy
    rows, cols = _elementwise_shape(fwd, layer)
    out_elements = rows * cols
    promoted = autocast.promotes(layer, dtypes)
    items: list[WorkItem] = []
    for i, needed in enumerate(grads):
        if not needed:
            continue
        tensor = layer.inputs[i]
        if layer.op_type in PASS_THROUGH_OPS or (layer.op_type in NEGATING_OPS and i == 0):
            pass  # dY flows through unchanged
        elif layer.op_type in NEGATING_OPS:
            items.append(_item(fwd, "elementwise", {"rows": rows, "cols": cols, "operands": 1},
                               DGRAD, precision, op="neg"))
        else:
            item = _item(fwd, "elementwise",
                         {"rows": rows, "cols": cols,
                          "operands": _dgrad_operands(layer, i, out_elements)},
                         DGRAD, precision, op=f"{fwd.op}{GRADIENT_OP_SUFFIX}")
            # dY is at the output's dtype; an other operand at another converts as it loads
            others = autocast.operand_dtypes(layer, dtypes, skip=i) if promoted else frozenset()
            items.append(autocast.unrolled(item) if others - {fwd.dtype} else item)
        cast = autocast.gradient_cast(layer, tensor, fwd.dtype, dtypes)
        if cast is not None:
            items.append(cast)
        if 0 < tensor.elements < out_elements:  # broadcast input: its gradient is summed
            items.append(_item(fwd, "reduce", {"rows": tensor.elements,
                                               "cols": out_elements // tensor.elements},
                               BGRAD, precision, op="ReduceSum", family=OpFamily.REDUCTION))
    return items


def _dgrad_operands(layer: Layer, i: int, out_elements: int) -> int:
    """dY plus the saved full-size operands input `i`'s gradient reads.

    A unary op (or one whose other inputs are scalars) reads X; otherwise the gradient reads
    the other inputs (the factor of a Mul, cond of a Where), and a broadcast one (a mask
    [B,1,1,S], a per-channel scale) is nearly free, as in the forward pass.
    """
    others = [t for j, t in enumerate(layer.inputs) if j != i and t.elements > 1]
    if not others:
        return 2
    return 1 + sum(1 for t in others if t.elements >= out_elements)


def _reduce(layer: Layer, fwd: WorkItem, grads: tuple[bool, ...], precision: str) -> list[WorkItem]:
    dims = {"rows": fwd.dims["rows"], "cols": fwd.dims["cols"], "operands": 1}
    return [_item(fwd, "elementwise", dims, DGRAD, precision, op="expand",
                  family=OpFamily.ELEMENTWISE)]


_DERIVERS = {
    "gemm": _gemm,
    "conv2d": _conv,
    "layernorm": _norm,
    "batchnorm": _same_as_forward,
    "softmax": _softmax,
    "pool": _same_as_forward,
    "elementwise": _elementwise,
    "reduce": _reduce,
    "memcpy": _memcpy,
}
