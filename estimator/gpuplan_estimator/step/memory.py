"""Pure per-GPU memory model of a training (or inference) step.

Parts (bytes per GPU, P = parameter count):

- parameters: fp32 4P; mixed precision keeps fp32 master weights plus a half copy, 6P;
  inference holds the weights once at the compute width.
- gradients: at the width of the weights the step differentiates: fp32 4P, mixed 2P.
- optimizer state (fp32): sgd 0, momentum 4P, adam/adamw 8P, adagrad 4P, rmsprop 4P. With the
  gradients this gives the 16P of mixed-precision Adam in ZeRO (Rajbhandari et al., SC'20, §3.1).
- activations: training keeps every tensor some layer's backward reads (`saved_tensors`), each
  counted once, as PyTorch autograd's saved tensors do; inference keeps only the peak of
  simultaneously live tensors. A fused attention (`step.attention`) keeps its output and
  logsumexp instead of its scores and probabilities, which never exist in memory.
- workspace: the largest single layer's inputs+outputs (transient gradient buffers of the layer
  being differentiated) plus a fixed cuBLAS/cuDNN workspace.
- framework overhead: the CUDA context and allocator reserve, a documented constant.

Batch-proportional parts (activations, workspace) scale with the per-GPU batch
ceil(global / data_parallel) relative to the batch the graph was built at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import (
    DTYPE_BYTES,
    FLOAT_DTYPES,
    Layer,
    ModelGraph,
    OpFamily,
    TensorInfo,
)
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.step import attention
from gpuplan_estimator.step.decomposition import TrainingSettings, gradient_tensors

MIB = 1024 * 1024
# CUDA context + PyTorch's caching-allocator reserve on first use: typically 300-600 MiB with
# CUDA 11.7+ lazy module loading; we take the upper-middle of that range.
CUDA_CONTEXT_BYTES = 512 * MIB
# cuBLAS keeps a per-handle workspace (PyTorch default ":4096:8", 32 MiB) and cuDNN picks
# algorithms with workspace capped by the allocator; 64 MiB covers both typical defaults.
LIBRARY_WORKSPACE_BYTES = 64 * MIB
OPTIMIZER_STATE_WORDS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "adagrad": 1, "rmsprop": 1}
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


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one GPU needs for a training step, by part, at its per-GPU batch."""
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    workspace_bytes: int
    framework_overhead_bytes: int
    per_gpu_batch: int
    data_parallel: int

    @property
    def total_bytes(self) -> int:
        """Sum of all parts in bytes."""
        return (
            self.parameters_bytes + self.gradients_bytes + self.optimizer_state_bytes
            + self.activations_bytes + self.workspace_bytes + self.framework_overhead_bytes
        )

    def fits(self, device: DeviceSpec) -> bool:
        """Whether the total fits in the device's memory."""
        return self.total_bytes <= device.memory_bytes

    def as_dict(self) -> dict[str, int]:
        """Every part and the total, in bytes, keyed as in the estimate JSON."""
        return {
            "parameters_bytes": self.parameters_bytes,
            "gradients_bytes": self.gradients_bytes,
            "optimizer_state_bytes": self.optimizer_state_bytes,
            "activations_bytes": self.activations_bytes,
            "workspace_bytes": self.workspace_bytes,
            "framework_overhead_bytes": self.framework_overhead_bytes,
            "total_bytes": self.total_bytes,
        }


def training_memory(
    graph: ModelGraph, settings: TrainingSettings, *, data_parallel: int = 1
) -> MemoryBreakdown:
    """Bytes one GPU needs to run a step of `graph` (built at `settings.batch_size`)."""
    settings.check()
    if isinstance(data_parallel, bool) or not isinstance(data_parallel, int) or data_parallel < 1:
        raise InvalidRequestError(
            "data_parallel", f"must be a positive integer, got {data_parallel!r}"
        )
    per_gpu_batch = math.ceil(settings.batch_size / data_parallel)
    batch_scale = per_gpu_batch / settings.batch_size
    p = graph.parameter_count
    width = settings.activation_bytes
    fused = attention.fused_attention(graph, settings.attention)
    if settings.training:
        params = p * (4 + width) if settings.mixed_precision else 4 * p
        grads = p * width if settings.mixed_precision else 4 * p
        state = 4 * p * OPTIMIZER_STATE_WORDS[settings.optimizer]
        activations = saved_activation_bytes(graph, width, fused)
    else:
        params, grads, state = p * width, 0, 0
        activations = peak_live_bytes(graph, width, fused.internal)
    workspace = max((_layer_io_bytes(layer, width, fused.internal) for layer in graph.layers),
                    default=0)
    return MemoryBreakdown(
        parameters_bytes=params,
        gradients_bytes=grads,
        optimizer_state_bytes=state,
        activations_bytes=math.ceil(activations * batch_scale),
        workspace_bytes=math.ceil(workspace * batch_scale) + LIBRARY_WORKSPACE_BYTES,
        framework_overhead_bytes=CUDA_CONTEXT_BYTES,
        per_gpu_batch=per_gpu_batch,
        data_parallel=data_parallel,
    )


def tensor_bytes(tensor: TensorInfo, width: int) -> int:
    """Size at run time: float tensors at the activation width, others at their own."""
    if tensor.dtype in FLOAT_DTYPES:
        return tensor.elements * width
    return tensor.elements * DTYPE_BYTES[tensor.dtype]


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


def saved_activation_bytes(graph: ModelGraph, width: int,
                           fused: attention.FusedAttention = attention.EAGER) -> int:
    """Tensors kept from forward to backward: saved by a layer whose backward runs, once each."""
    needs_grad = gradient_tensors(graph)
    kept: dict[str, int] = {}
    for layer in graph.layers:
        if not any(t.name in needs_grad for t in layer.inputs):
            continue
        for tensor in saved_tensors(layer, needs_grad, fused):
            kept[tensor.name] = tensor_bytes(tensor, width)
    return sum(kept.values())


def peak_live_bytes(graph: ModelGraph, width: int, internal: frozenset[str] = frozenset()
                    ) -> int:
    """Inference: the largest sum of tensors alive at once (produced, not yet last consumed);
    `internal` tensors stay inside a fused kernel and take no memory."""
    last_use: dict[str, int] = {}
    for i, layer in enumerate(graph.layers):
        for t in layer.inputs:
            last_use[t.name] = i
    params = {name for layer in graph.layers for name in layer.parameter_inputs}
    live: dict[str, int] = {}
    peak = 0
    for i, layer in enumerate(graph.layers):
        for t in layer.inputs:
            if t.name not in params and t.name not in live:
                live[t.name] = tensor_bytes(t, width)  # graph inputs are alive from the start
        for t in layer.outputs:
            live[t.name] = 0 if t.name in internal else tensor_bytes(t, width)
        peak = max(peak, sum(live.values()))
        for name in [n for n in live if last_use.get(n, i) <= i]:
            del live[name]
    return peak


def _layer_io_bytes(layer: Layer, width: int, internal: frozenset[str]) -> int:
    if layer.family is OpFamily.SHAPE_ONLY:
        return 0
    params = set(layer.parameter_inputs)
    tensors = [t for t in [*layer.inputs, *layer.outputs]
               if t.name not in params and t.name not in internal]
    return sum(tensor_bytes(t, width) for t in tensors)
