"""Which tensors each layer's backward reads (autograd's saved tensors), by op.

Shared by the peak walk (`memory_walk`), the kept-tensor sum (`memory.saved_activation_bytes`)
and the per-block layout (`block_activations`).
"""

from __future__ import annotations

from gpuplan_estimator.core.layers import FLOAT_DTYPES, Layer, OpFamily, TensorInfo
from gpuplan_estimator.step import attention

# Inputs whose values the backward of these ops does not read (it needs only shapes).
_SAVES_NOTHING = frozenset({"Add", "Sub", "Sum", "Neg", "Identity", "Cast", "AveragePool",
                            "GlobalAveragePool", "ReduceSum", "ReduceMean", "Flatten", "Reshape",
                            "Squeeze", "Unsqueeze", "Transpose", "Concat", "Split", "Slice",
                            "Expand", "Pad", "Dropout"})
# Products: an operand is kept only for the gradient of another operand.
_OTHER_OPERAND_OPS = frozenset({"MatMul", "Gemm", "Einsum", "Conv", "ConvTranspose", "Mul",
                                "Div"})
# Ops whose backward reads their output rather than their input.
_SAVES_OUTPUT = frozenset({"Relu", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "Exp", "Sqrt"})
# Max pooling also keeps the argmax of every output element as int64 (ATen's
# max_pool2d_with_indices saves `indices` for its backward); measured on CPU in docs/memory.md.
_SAVES_INDICES = frozenset({"MaxPool"})


def saved_tensors(layer: Layer, needs_grad: frozenset[str],
                  fused: attention.FusedAttention = attention.EAGER) -> tuple[TensorInfo, ...]:
    """Activations this layer's backward reads (parameters are counted separately), under the
    attention `fused` describes.

    Products (MatMul, Conv, Mul, Div, Where) keep an operand only when another operand needs a
    gradient: dX of X·W needs W, dW needs X; Where needs only its condition.
    """
    if layer.name in fused.members:
        return tuple(fused.kept.get(layer.name, ()))
    return _saved_tensors(layer, needs_grad)


def _saved_tensors(layer: Layer, needs_grad: frozenset[str]) -> tuple[TensorInfo, ...]:
    if layer.family is OpFamily.SHAPE_ONLY or layer.op_type in _SAVES_NOTHING:
        return ()
    if layer.op_type in _SAVES_OUTPUT:
        return tuple(t for t in layer.outputs if t.dtype in FLOAT_DTYPES)
    if layer.op_type == "Where":  # gradients are dY masked by the condition
        return layer.inputs[:1]
    params = set(layer.parameter_inputs)
    if layer.op_type in _SAVES_INDICES:
        indices = tuple(TensorInfo(f"{t.name}#indices", t.shape, "int64")
                        for t in layer.outputs[:1])
        return tuple(t for t in layer.inputs if t.name not in params) + indices
    if layer.op_type not in _OTHER_OPERAND_OPS:
        return tuple(t for t in layer.inputs if t.name not in params)
    grads = [t.name in needs_grad for t in layer.inputs]
    return tuple(
        t for i, t in enumerate(layer.inputs)
        if t.name not in params and any(g for j, g in enumerate(grads) if j != i)
    )
