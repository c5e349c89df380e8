"""Saved activations split by the model's repeated blocks, for checkpointing and TP (#19).

`memory.saved_activation_bytes` gives the total kept from forward to backward; checkpointing
and tensor parallelism need it per block: what each block keeps (recomputed when it is
checkpointed), what it reads from earlier layers (its checkpoint, kept instead), and which of
its saved tensors tensor parallelism leaves whole.

Blocks come from layer names through a `block_of` function the caller passes
(`planning.rollup.block_of` recognises `transformer.h.3`, `/model/layers.3/`, `layer2.1`, …):
the step package sits below planning and does not import it.

Tensor parallelism without sequence parallelism (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", Table 2: sbh(10 + 24/t + 5as/(ht)) per layer)
splits the attention and MLP activations over t ranks but keeps whole the layer norms' inputs
(4sbh), the inputs of the first linear of attention and MLP, i.e. the layer norms' outputs
(2sbh + 2sbh), and the dropout masks after them (2sbh). In a graph we read that as: a saved
tensor is replicated when a normalization saves it, when a normalization produced it, or when a
Dropout saves it; every other tensor saved inside a block is split. Tensors saved outside
blocks (embeddings, the head) are taken as replicated.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.step import attention, memory, saved
from gpuplan_estimator.step.decomposition import TrainingSettings, gradient_tensors

NORMALIZATIONS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization",
                            "SkipLayerNormalization", "RMSNormalization",
                            "GroupNormalization", "BatchNormalization",
                            "InstanceNormalization"})


@dataclass(frozen=True)
class BlockActivations:
    """One repeated block's activation bytes at the layout's batch."""

    name: str
    input_bytes: int
    """Tensors the block reads that layers outside it made: what a checkpoint keeps."""
    saved_bytes: int
    """Tensors the block's layers keep for backward (recomputed when checkpointed)."""
    replicated_bytes: int
    """The part of `saved_bytes` tensor parallelism without sequence parallelism keeps whole."""
    parameter_count: int
    """Trainable elements of the block: the unit ZeRO-3/FSDP gathers at once."""


@dataclass(frozen=True)
class ActivationLayout:
    """A graph's saved activations by block, at `per_gpu_batch` samples."""

    per_gpu_batch: int
    blocks: tuple[BlockActivations, ...]
    outside_saved_bytes: int
    """Saved by layers outside every block (embeddings, final norm, head)."""
    largest_layer_parameter_count: int

    @property
    def saved_bytes(self) -> int:
        """All saved activations: equals `memory.saved_activation_bytes` at this batch."""
        return self.outside_saved_bytes + sum(b.saved_bytes for b in self.blocks)

    @property
    def gather_unit_parameter_count(self) -> int:
        """Parameters gathered at once under ZeRO-3/FSDP: the largest block (FSDP wraps each
        transformer block), or the largest layer of a model without blocks."""
        return max((b.parameter_count for b in self.blocks),
                   default=self.largest_layer_parameter_count)

    def at_batch(self, per_gpu_batch: int) -> ActivationLayout:
        """The same layout at another batch: activation bytes are per-sample, linear."""
        if isinstance(per_gpu_batch, bool) or not isinstance(per_gpu_batch, int) \
                or per_gpu_batch < 1:
            raise InvalidRequestError("per_gpu_batch",
                                      f"must be a positive integer, got {per_gpu_batch!r}")
        scale = per_gpu_batch / self.per_gpu_batch

        def scaled(n: int) -> int:
            return math.ceil(n * scale)

        blocks = tuple(replace(b, input_bytes=scaled(b.input_bytes),
                               saved_bytes=scaled(b.saved_bytes),
                               replicated_bytes=scaled(b.replicated_bytes)) for b in self.blocks)
        return replace(self, per_gpu_batch=per_gpu_batch, blocks=blocks,
                       outside_saved_bytes=scaled(self.outside_saved_bytes))


def activation_layout(graph: ModelGraph, settings: TrainingSettings, *,
                      block_of: Callable[[str], str], outside_label: str) -> ActivationLayout:
    """Saved activations of `graph` (built at `settings.batch_size`) by block.

    `block_of(layer_name)` names a layer's block, `outside_label` when it is in none. Each
    saved tensor is counted once, in the block of the first layer that saves it, as
    `memory.saved_activation_bytes` counts it.
    """
    settings.check()
    width = settings.activation_bytes
    needs_grad = gradient_tensors(graph)
    fused = attention.fused_attention(graph, settings.attention)
    params = {name for layer in graph.layers for name in layer.parameter_inputs}
    producer_block: dict[str, str] = {}
    normalized: set[str] = set()
    seen: set[str] = set()
    acc: dict[str, list[int]] = {}  # block -> [input, saved, replicated, parameters]
    read: dict[str, set[str]] = {}
    for layer in graph.layers:
        block = block_of(layer.name)
        sums = acc.setdefault(block, [0, 0, 0, 0])
        sums[3] += layer.parameter_count
        for t in layer.inputs:
            made_by = producer_block.get(t.name)
            if made_by is not None and made_by != block and t.name not in params \
                    and t.name not in read.setdefault(block, set()):
                read[block].add(t.name)
                sums[0] += memory.tensor_bytes(t, width)
        if any(t.name in needs_grad for t in layer.inputs):
            for t in saved.saved_tensors(layer, needs_grad, fused):
                if t.name in seen:
                    continue
                seen.add(t.name)
                size = memory.tensor_bytes(t, width)
                sums[1] += size
                if layer.op_type in NORMALIZATIONS or layer.op_type == "Dropout" \
                        or t.name in normalized:
                    sums[2] += size
        for t in layer.outputs:
            producer_block[t.name] = block
            if layer.op_type in NORMALIZATIONS:
                normalized.add(t.name)
    outside = acc.pop(outside_label, [0, 0, 0, 0])
    blocks = tuple(BlockActivations(name, *sums) for name, sums in acc.items())
    layout = ActivationLayout(
        per_gpu_batch=settings.batch_size, blocks=blocks, outside_saved_bytes=outside[1],
        largest_layer_parameter_count=max((la.parameter_count for la in graph.layers),
                                          default=0))
    return layout
