"""Pure: which Transposes and Splits eager PyTorch runs as views (issue #30).

An exporter writes `permute`/`transpose` as ONNX Transpose, which onnxruntime runs as a copy.
Eager PyTorch does not: it returns a view with permuted strides, and a copy happens only where
a later op needs memory in another order: a `reshape` the strides cannot express
(`view_strides`), or an op that reads its input contiguously. So a Transpose costs a kernel in an
eager step only when some use of its view, followed through the views made from it, needs one;
otherwise it is a dispatch on the host and nothing on the GPU (the memory walk already treats it
as a view: `memory_walk.VIEW_OPS`).

What reads a strided view without a copy, as PyTorch 2.x does:

- elementwise ops (TensorIterator walks any strides) and `clone` (a dynamo export's Identity:
  it is the copy, priced as its own layer);
- a GEMM whose matrix dims have unit stride in one of them and whose batch dims collapse to one
  stride (cuBLAS's transpose flags and strided batches);
- a fused attention core's Q, K and V with a unit-stride head dim
  (`scaled_dot_product_attention` takes them by their strides; an exporter's Kᵀ is its own
  decomposition's, so either of the last two dims may be the head dim);
- another view (Transpose; Reshape, Flatten, Squeeze, Unsqueeze when the strides allow).

Everything else (softmax, norms, convolutions, gathers, concatenation, a reshape the strides do
not allow) reads its input contiguously, and the Transpose it came from is priced as the copy.

A fused attention core writes its output as [batch, queries, heads, head dim] and returns it
as a [batch, heads, queries, head dim] view (flash, memory-efficient and cuDNN attention all
do), so the exporter's Transpose back to [batch, queries, heads, head dim] is a view and the
reshape merging the heads too: GPT-2's profiled forward on the H200 has no such copy.

A Split is `torch.split`/`chunk`: slices of its input, views with the input's strides (GPT-2's
fused Q/K/V projection split three ways along the hidden axis), a copy only where some use
needs one, by the same rule. Its backward is a `cat` of the slices' gradients either way.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

from gpuplan_estimator.core.layers import Layer, ModelGraph, OpFamily
from gpuplan_estimator.step import eager
from gpuplan_estimator.step.attention import FusedAttention

Strides = tuple[int, ...]
View = tuple[tuple[int, ...], Strides, str]
"""A strided view: its shape, its strides and the Transpose it comes from."""
RESHAPING_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
"""Ops that make a view when the strides allow the new shape (`view_strides`), else a copy."""
STRIDED_FAMILIES = frozenset({OpFamily.ELEMENTWISE})
"""Layer families whose kernels read any strides."""
SPLIT_OP = "Split"
"""`torch.split`/`chunk` as exported: slices that are views of their input."""


def contiguous_strides(shape: Sequence[int]) -> Strides:
    """Row-major strides of `shape`, in elements."""
    out = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        out[i] = out[i + 1] * max(shape[i + 1], 1)
    return tuple(out)


def is_contiguous(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether `strides` lay `shape` out row-major (size-1 dims may have any stride)."""
    expected = contiguous_strides(shape)
    return all(size == 1 or s == e for size, s, e in zip(shape, strides, expected, strict=True))


def view_strides(shape: Sequence[int], strides: Sequence[int],
                 new_shape: Sequence[int]) -> Strides | None:
    """The strides of `new_shape` as a view of (`shape`, `strides`), or None when no view can
    express it (PyTorch's `view` rule: each run of old dims that are contiguous with one another
    must be split or merged whole by the new dims)."""
    if math.prod(shape) != math.prod(new_shape):
        return None
    chunks: list[tuple[int, int]] = []  # (elements, innermost stride) of mergeable runs
    for size, stride in zip(shape, strides, strict=True):
        if size == 1:
            continue
        if chunks and chunks[-1][1] == stride * size:
            chunks[-1] = (chunks[-1][0] * size, stride)
        else:
            chunks.append((size, stride))
    out = [1] * len(new_shape)
    i = 0
    for elements, inner in chunks:
        dims: list[int] = []
        product = 1
        while product < elements and i < len(new_shape):
            dims.append(i)
            product *= new_shape[i]
            i += 1
        if product != elements:
            return None
        stride = inner
        for d in reversed(dims):
            out[d] = stride
            stride *= new_shape[d]
    if any(size != 1 for size in new_shape[i:]):
        return None
    return tuple(out)


def gemm_reads(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether a GEMM reads a strided operand as it is: its matrix dims have unit stride in one
    of them, and its batch dims collapse to one stride."""
    if len(shape) < 2:
        return True
    rows, cols = shape[-2:]
    row_stride, col_stride = strides[-2:]
    if not (col_stride == 1 or cols == 1 or row_stride == 1 or rows == 1):
        return False
    batch = [(size, stride) for size, stride in zip(shape[:-2], strides[:-2], strict=True)
             if size != 1]
    return all(outer == inner_stride * inner_size for (_, outer), (inner_size, inner_stride)
               in itertools.pairwise(batch))


def view_layers(graph: ModelGraph, fused: FusedAttention) -> frozenset[str]:
    """The Transpose and Split layers of `graph` that eager PyTorch runs as views: every use
    of the view, followed through the views made from it, reads it as it is (module
    docstring)."""
    strided: dict[str, View] = {}  # non-contiguous views by tensor name
    copies: set[str] = set()
    candidates: list[str] = []
    for layer in graph.layers:
        if layer.op_type == "Transpose" and layer.inputs and layer.outputs:
            candidates.append(layer.name)
            if not _permute(layer, strided):
                copies.add(layer.name)
            continue
        if layer.op_type == SPLIT_OP and layer.inputs and layer.outputs:
            candidates.append(layer.name)
            if not _slice(layer, strided):
                copies.add(layer.name)
            continue
        if layer.name in fused.kept:  # a fused core's ·V: its output, heads-major view
            _heads_major_output(layer, strided)
        for t in layer.inputs:
            view = strided.get(t.name)
            if view is None:
                continue
            shape, strides, origin = view
            if layer.op_type in RESHAPING_OPS and t is layer.inputs[0] and layer.outputs:
                out = layer.outputs[0]
                new = view_strides(shape, strides, out.shape)
                if new is None:
                    copies.add(origin)
                elif not is_contiguous(out.shape, new):
                    strided[out.name] = (tuple(out.shape), new, origin)
            elif not _reads_strided(layer, shape, strides, fused):
                copies.add(origin)
    return frozenset(candidates) - copies


def _permute(layer: Layer, strided: dict[str, View]) -> bool:
    """Record the Transpose's output view; False when the graph's annotations contradict it
    (the Transpose is then left a copy)."""
    source, out = layer.inputs[0], layer.outputs[0]
    shape, strides, origin = strided.get(
        source.name, (tuple(source.shape), contiguous_strides(source.shape), layer.name))
    origin = origin or layer.name  # a kernel's own output view: this Transpose would copy
    perm = layer.attributes.get("perm") or list(range(len(shape)))[::-1]
    if len(perm) != len(shape):
        return False
    new_shape = tuple(shape[p] for p in perm)
    new_strides = tuple(strides[p] for p in perm)
    if not is_contiguous(new_shape, new_strides):
        strided[out.name] = (new_shape, new_strides, origin)
    return True


def _heads_major_output(layer: Layer, strided: dict[str, View]) -> None:
    """Register a fused core's 4-D output [b, h, s, d] as the view of a [b, s, h, d] buffer
    it is, with no origin of its own: a copy it needs is the Transpose's that makes it."""
    if not layer.outputs or len(layer.outputs[0].shape) != 4:
        return
    out = layer.outputs[0]
    b, h, s, d = out.shape
    sb, ss, sh, sd = contiguous_strides((b, s, h, d))
    strided[out.name] = (tuple(out.shape), (sb, sh, ss, sd), "")


def _slice(layer: Layer, strided: dict[str, View]) -> bool:
    """Record each slice's view (the input's strides); False when the graph's annotations
    contradict it (the Split is then left a copy)."""
    source = layer.inputs[0]
    _, strides, origin = strided.get(
        source.name, (tuple(source.shape), contiguous_strides(source.shape), layer.name))
    if any(len(out.shape) != len(strides) for out in layer.outputs):
        return False
    for out in layer.outputs:
        if not is_contiguous(out.shape, strides):
            strided[out.name] = (tuple(out.shape), strides, origin)
    return True


def _reads_strided(layer: Layer, shape: Sequence[int], strides: Sequence[int],
                   fused: FusedAttention) -> bool:
    if (layer.family in STRIDED_FAMILIES or layer.family is OpFamily.SHAPE_ONLY
            or layer.op_type in eager.CLONE_OPS):
        return True  # a Shape, Size (metadata) reads no elements at all
    if layer.name in fused.members:  # one kernel reading 4-D Q, K, V by their strides
        return len(strides) < 2 or 1 in strides[-2:]
    if layer.family is OpFamily.MATMUL:
        return gemm_reads(shape, strides)
    return False
