"""Pure: mixed precision as torch.autocast runs it (issue #30 part 2).

Under `torch.autocast(bfloat16)` (or float16) over fp32 weights:

- GEMMs, convolutions and attention (`precisions.AUTOCAST_LOWER_OPS`) run in the half dtype:
  every fp32 operand is cast first. A weight's cast is cached for the autocast region, so each
  weight is cast once per forward; an activation is cast at each use.
- Softmax, norms, reductions, pow/exp/log and the losses (`precisions.AUTOCAST_FP32_OPS`) run
  in fp32: a half operand is cast up, and the output is fp32.
- Batch norm runs in its data input's dtype (`precisions.AUTOCAST_INPUT_DTYPE_OPS`): its fp32
  weight, bias and running statistics do not promote, so conv → batch norm → ReLU stays half.
- A linear's bias Add (`eager.linear_biases`) is inside its GEMM: the sum is half.
- Everything else runs in the widest float dtype of its operands (0-dim and one-element
  operands do not promote, as in PyTorch), so a transformer's residual stream, fed by fp32
  embeddings and LayerNorm outputs, stays fp32 while its GEMM outputs are half.
- Backward runs each cast's backward (ToCopyBackward: one more cast of the gradient).
- An elementwise op over operands of two dtypes (a half GEMM output added to the fp32 residual
  stream) and every upcast convert dtypes element by element, which TensorIterator runs
  unvectorised (`unrolled`, priced by `cost.unrolled`); PyTorch's fp32-to-half copies are
  vectorised. Such an op's gradient for its half operand is computed in fp32 and cast back to
  half by the autograd engine (`gradient_cast`).

`tensor_dtypes` propagates those rules over the graph; `cast_items` is the cast kernels they
add. Precisions without autocast run every float tensor at their compute dtype.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType

from gpuplan_estimator.core import precisions
from gpuplan_estimator.core.layers import (
    DTYPE_BYTES,
    FLOAT_DTYPES,
    Layer,
    ModelGraph,
    OpFamily,
    TensorInfo,
)
from gpuplan_estimator.core.vocabulary import CAST_OP
from gpuplan_estimator.core.workload import DYNAMIC_CAST, Phase, WorkItem, elementwise_dims
from gpuplan_estimator.step import eager
from gpuplan_estimator.step.attention import EAGER, FusedAttention

FP32 = "float32"


def tensor_dtypes(graph: ModelGraph, precision: str,
                  biases: Mapping[str, str] | None = None) -> Mapping[str, str]:
    """The dtype each float tensor has when `graph` runs under `precision` (empty without
    autocast: every float tensor is then at the precision's compute dtype). `biases` is
    `eager.linear_biases` of the graph when the caller has it already."""
    entry = precisions.precision(precision)
    if not entry.autocast:
        return MappingProxyType({})
    half = entry.compute_dtype
    if biases is None:
        biases = eager.linear_biases(graph.layers, eager.parameter_sizes(graph))
    dtypes: dict[str, str] = {}
    for layer in graph.layers:
        out = (dtypes.get(biases[layer.name], half) if layer.name in biases
               else _output_dtype(layer, dtypes, half))
        if out is None:
            continue
        for t in layer.outputs:
            if t.dtype in FLOAT_DTYPES:
                dtypes[t.name] = out
    return MappingProxyType(dtypes)


def _output_dtype(layer: Layer, dtypes: Mapping[str, str], half: str) -> str | None:
    if layer.op_type in precisions.AUTOCAST_LOWER_OPS:
        return half
    if layer.op_type in precisions.AUTOCAST_FP32_OPS:
        return FP32
    if layer.op_type in precisions.AUTOCAST_INPUT_DTYPE_OPS and layer.inputs \
            and layer.inputs[0].dtype in FLOAT_DTYPES:
        return dtype_of(layer.inputs[0], dtypes)
    operands = [dtype_of(t, dtypes) for t in layer.inputs
                if t.dtype in FLOAT_DTYPES and t.elements > 1]
    if not operands:
        return None  # integer work, or only scalars: outputs keep their graph dtype
    return FP32 if FP32 in operands else half


def dtype_of(tensor: TensorInfo, dtypes: Mapping[str, str]) -> str:
    """A tensor's run-time dtype: the propagated one, else fp32 for a float graph input or
    weight (master weights and fp32 data), else its own."""
    if tensor.name in dtypes:
        return dtypes[tensor.name]
    return FP32 if tensor.dtype in FLOAT_DTYPES else tensor.dtype


def operand_dtypes(layer: Layer, dtypes: Mapping[str, str], skip: int | None = None
                   ) -> frozenset[str]:
    """The run-time dtypes of `layer`'s float operands (scalars and one-element tensors left
    out, as they do not promote; input `skip` too, when given)."""
    return frozenset(dtype_of(t, dtypes) for i, t in enumerate(layer.inputs)
                     if i != skip and t.dtype in FLOAT_DTYPES and t.elements > 1)


def promotes(layer: Layer, dtypes: Mapping[str, str]) -> bool:
    """Whether `layer` runs under autocast at its operands' widest dtype, reading them as they
    are (an op autocast lists reads its operands' casts: `cast_items`)."""
    return bool(dtypes) and not (layer.op_type in precisions.AUTOCAST_LOWER_OPS
                                 or layer.op_type in precisions.AUTOCAST_FP32_OPS
                                 or layer.op_type in precisions.AUTOCAST_INPUT_DTYPE_OPS)


def mixed_operands(layer: Layer, dtypes: Mapping[str, str]) -> bool:
    """Whether `layer` reads float operands of two run-time dtypes (never without autocast:
    `dtypes` is then empty)."""
    return promotes(layer, dtypes) and len(operand_dtypes(layer, dtypes)) > 1


def unrolled(item: WorkItem) -> WorkItem:
    """`item` marked as a kernel converting dtypes element by element (`DYNAMIC_CAST`)."""
    return replace(item, attributes=MappingProxyType({**item.attributes, DYNAMIC_CAST: 1}))


def gradient_cast(layer: Layer, tensor: TensorInfo, gradient_dtype: str,
                  dtypes: Mapping[str, str]) -> WorkItem | None:
    """The autograd engine's cast of input `tensor`'s gradient, computed at `gradient_dtype`,
    to the tensor's own dtype (a gradient takes its input's dtype); None when they agree, or
    when autocast cast the operand itself (that cast's backward is `cast_items`')."""
    own = dtype_of(tensor, dtypes)
    if not promotes(layer, dtypes) or own == gradient_dtype or tensor.dtype not in FLOAT_DTYPES:
        return None
    return _cast(layer, tensor, gradient_dtype, own, Phase.BACKWARD)


def cast_items(graph: ModelGraph, precision: str, dtypes: Mapping[str, str],
               needs_grad: frozenset[str], fused: FusedAttention = EAGER, *,
               eager: bool = True) -> tuple[tuple[WorkItem, ...], tuple[WorkItem, ...]]:
    """(forward, backward) cast kernels autocast adds to a step of `graph`: each weight cast
    once per forward, each activation cast at each use, and a gradient cast in backward for
    every cast of a tensor that needs one. Inside a fused attention core (`fused`) there is
    none: the core is one `scaled_dot_product_attention`, which autocast runs in the half dtype
    as it is, its scores and probabilities never leaving the kernel. Upcasts are marked
    `unrolled` when `eager` (TensorIterator's kernels; a compiler's are its own)."""
    entry = precisions.precision(precision)
    if not entry.autocast:
        return (), ()
    half = entry.compute_dtype
    forward: list[WorkItem] = []
    backward: list[WorkItem] = []
    weights_cast: set[str] = set()
    for layer in graph.layers:
        target = (half if layer.op_type in precisions.AUTOCAST_LOWER_OPS
                  else FP32 if layer.op_type in precisions.AUTOCAST_FP32_OPS else None)
        if target is None or layer.name in fused.folded:
            continue
        for t in layer.inputs:
            if t.dtype not in FLOAT_DTYPES or t.elements <= 1 or t.name in fused.internal:
                continue
            source = dtype_of(t, dtypes)
            if source == target:
                continue
            if t.name in layer.parameter_inputs:
                if t.name in weights_cast:
                    continue  # autocast's cast cache: once per forward
                weights_cast.add(t.name)
            forward.append(_cast(layer, t, source, target, Phase.FORWARD, eager))
            if t.name in needs_grad:
                backward.append(_cast(layer, t, target, source, Phase.BACKWARD, eager))
    return tuple(forward), tuple(backward)


def _cast(layer: Layer, tensor: TensorInfo, source: str, target: str, phase: Phase,
          eager: bool = True) -> WorkItem:
    # `operands` counts reads in the output's width: a cast to half reads two halves' bytes
    reads = max(1, DTYPE_BYTES[source] // DTYPE_BYTES[target])
    item = WorkItem(
        layer=layer.name, family=OpFamily.ELEMENTWISE, kernel="elementwise", phase=phase,
        dims=MappingProxyType(elementwise_dims(tensor, reads)),
        dtype=target, flops=0,
        bytes_moved=tensor.elements * (DTYPE_BYTES[source] + DTYPE_BYTES[target]),
        op=CAST_OP, role="autocast_cast" if phase is Phase.FORWARD else "autocast_cast_grad")
    return unrolled(item) if eager and DTYPE_BYTES[target] > DTYPE_BYTES[source] else item
