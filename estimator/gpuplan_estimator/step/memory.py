"""Pure per-GPU memory model of a training (or inference) step: a peak, not a sum.

`step.memory_walk` walks the step's schedule (forward, the loss, backward in reverse freeing
saved tensors, the optimizer's foreach step) and finds the instant with the most live bytes,
as `torch.cuda.max_memory_allocated` measures it. The breakdown is what is live then (bytes per
GPU, P = parameter count):

- parameters: the fp32 weights, 4P (torch.autocast keeps them fp32 in every precision), plus
  autocast's half-precision weight copies still live at the peak.
- gradients: the parameters' fp32 `.grad` live at the peak (none at the start of backward,
  4P in the optimizer step; zero_grad(set_to_none=True) frees them).
- optimizer state (fp32): sgd 0, momentum 4P, adam/adamw 8P, adagrad 4P, rmsprop 4P, plus
  the foreach path's temporaries when the peak is in the optimizer step.
- activations: inputs, activations, tensors saved for backward (`saved_tensors`), the loss's
  log-probabilities and the activation gradients live at the peak. A fused attention
  (`step.attention`) keeps its output and logsumexp; its scores never exist in memory.
- workspace: cuBLAS/cuDNN workspace, allocated through PyTorch's caching allocator.

`allocated_peak_bytes` (parameters through workspace) is comparable to max_memory_allocated.
`framework_overhead_bytes` (CUDA context, outside the allocator, and the allocator's reserved
but free memory) is added only for the fit decision: `fits` compares `total_bytes` with
`usable_memory_bytes(device)`, what the card gives a process (NVML's total, not the datasheet).

Batch-proportional tensors scale with the per-GPU batch ceil(global / data_parallel) relative
to the batch the graph was built at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuplan_estimator.core import vocabulary
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import (
    DTYPE_BYTES,
    FLOAT_DTYPES,
    ModelGraph,
    TensorInfo,
)
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.step import attention, memory_walk
from gpuplan_estimator.step.decomposition import TrainingSettings, gradient_tensors
from gpuplan_estimator.step.saved import saved_tensors

MIB = 1024 * 1024
# The CUDA context (driver state, kernel images loaded lazily since CUDA 11.7): outside
# PyTorch's allocator, so not in max_memory_allocated; typically 300-600 MiB, we take 512 MiB.
CUDA_CONTEXT_BYTES = 512 * MIB
# What the caching allocator reserves beyond the live blocks (2 MiB / 20 MiB segments, blocks
# not split when less than 1 MiB would remain, fragmentation), as a share of the allocated
# peak: max_memory_reserved / max_memory_allocated - 1 was 0.03 to 0.10 over ten training
# runs (ViT-B/16, ResNet-50; H200, 2026-11-27, hack/memory_probe.py, docs/memory.md); we take
# the largest, since a fit that fragments runs out of memory.
ALLOCATOR_RESERVE_FRACTION = 0.10
# cuBLAS keeps a per-handle workspace allocated through the caching allocator (PyTorch's
# default CUBLAS_WORKSPACE_CONFIG is ":4096:8", 32 MiB, on Hopper) and cuDNN takes
# convolution workspace from it too; 64 MiB covers both.
LIBRARY_WORKSPACE_BYTES = 64 * MIB
OPTIMIZER_STATE_WORDS = {"sgd": 0, "momentum": 1, "adam": 2, "adamw": 2, "adagrad": 1, "rmsprop": 1}


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one GPU needs for a training step, by part, at its per-GPU batch."""
    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    workspace_bytes: int
    framework_overhead_bytes: int
    """CUDA context and allocator reserve: not in `allocated_peak_bytes`, only in the fit."""
    per_gpu_batch: int
    data_parallel: int
    parameter_count: int = 0
    saved_activations_bytes: int = 0
    """Every tensor kept for backward, summed (not a peak): what `sharding` divides under a
    strategy, checkpointing or model parallelism."""
    reduced_gradients_bytes: int = 0
    """Gradients data parallelism all-reduces per step (P at the differentiated width: fp32 4P,
    fp16/bf16 2P); a communication size, not a part of the peak."""
    peak_phase: str = ""
    """Where the peak is: "forward", "backward", "optimizer" or "inference"."""

    @property
    def allocated_peak_bytes(self) -> int:
        """The predicted torch.cuda.max_memory_allocated: every part but the overhead."""
        return (
            self.parameters_bytes + self.gradients_bytes + self.optimizer_state_bytes
            + self.activations_bytes + self.workspace_bytes
        )

    @property
    def total_bytes(self) -> int:
        """What the process needs on the GPU: the allocated peak plus the overhead."""
        return self.allocated_peak_bytes + self.framework_overhead_bytes

    def fits(self, device: DeviceSpec) -> bool:
        """Whether the total fits in what `device` gives a process (`usable_memory_bytes`)."""
        return self.total_bytes <= usable_memory_bytes(device)

    def as_dict(self) -> dict[str, int]:
        """Every part and the total, in bytes, keyed as in the estimate JSON."""
        return {part: getattr(self, part) for part in vocabulary.MEMORY_PARTS} | {
            vocabulary.MEMORY_TOTAL: self.total_bytes}


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
    fused = attention.fused_attention(graph, settings.attention)
    walk = memory_walk.peak(graph, walk_settings(settings, batch_scale), fused)
    saved = saved_activation_bytes(graph, settings.activation_bytes, fused) \
        if settings.training else 0
    allocated = walk.total_bytes + LIBRARY_WORKSPACE_BYTES
    return MemoryBreakdown(
        parameters_bytes=walk.weights_bytes,
        gradients_bytes=walk.gradients_bytes,
        optimizer_state_bytes=walk.optimizer_bytes,
        activations_bytes=walk.activations_bytes,
        workspace_bytes=LIBRARY_WORKSPACE_BYTES,
        framework_overhead_bytes=framework_overhead_bytes(allocated),
        per_gpu_batch=per_gpu_batch,
        data_parallel=data_parallel,
        parameter_count=graph.parameter_count,
        saved_activations_bytes=math.ceil(saved * batch_scale),
        reduced_gradients_bytes=graph.parameter_count * (
            settings.activation_bytes if settings.mixed_precision else 4) * settings.training,
        peak_phase=walk.phase,
    )


def walk_settings(settings: TrainingSettings, batch_scale: float) -> memory_walk.WalkSettings:
    """What `memory_walk` needs of `settings`: fp16/bf16 run under torch.autocast."""
    return memory_walk.WalkSettings(
        training=settings.training,
        half_bytes=settings.activation_bytes if settings.mixed_precision else 0,
        optimizer=settings.optimizer,
        optimizer_state_words=OPTIMIZER_STATE_WORDS[settings.optimizer],
        batch_scale=batch_scale, optimizer_impl=settings.optimizer_impl)


def framework_overhead_bytes(allocated_peak_bytes: int) -> int:
    """Bytes a process needs beyond its allocated peak: the CUDA context and the allocator's
    reserve (`ALLOCATOR_RESERVE_FRACTION`)."""
    return CUDA_CONTEXT_BYTES + math.ceil(ALLOCATOR_RESERVE_FRACTION * allocated_peak_bytes)


def usable_memory_bytes(device: DeviceSpec) -> int:
    """What `device` gives one process: NVML's total where the catalog records it
    (`usable_memory_bytes`), else the datasheet capacity. The one capacity every fit check
    compares with (`total_bytes`, which holds the context and allocator reserve)."""
    return device.usable_memory_bytes or device.memory_bytes


def tensor_bytes(tensor: TensorInfo, width: int) -> int:
    """Size at run time: float tensors at the activation width, others at their own."""
    if tensor.dtype in FLOAT_DTYPES:
        return tensor.elements * width
    return tensor.elements * DTYPE_BYTES[tensor.dtype]


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
