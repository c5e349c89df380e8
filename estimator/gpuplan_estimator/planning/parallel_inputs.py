"""What the parallelism model reads from an estimate and a graph: the step cut into regions and
layer kinds (`SingleGpuSplit`), and the model's widths (`ModelDims`).

Layers are assigned by name and op family: blocks are found as `rollup.block_of` finds them;
inside a block, GEMMs, the attention core and everything under an attention or MLP sub-module
are split by Megatron's TP (Shoeybi et al. 2019 §3: column-parallel first GEMM, row-parallel
second, attention split by heads), layer norms and residual adds are replicated. Outside the
blocks, GEMMs (the output layer, vocab-parallel in Megatron) are split, the rest (embedding
gathers, the final norm) replicated.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import Layer, ModelGraph, OpFamily
from gpuplan_estimator.core.precisions import PRECISION_TABLE
from gpuplan_estimator.parallel.layouts import ModelDims, RegionTime, SingleGpuSplit
from gpuplan_estimator.planning import rollup
from gpuplan_estimator.planning.estimates import SEQUENCE_DIM, DeviceStepEstimate, LayerTimeEstimate

ELEMENT_BYTES = {name: p.activation_bytes for name, p in PRECISION_TABLE.items()}
"""Activation element size per compute precision (mixed precision keeps activations at 16 bit)."""
_ALWAYS_SPLIT = frozenset({OpFamily.MATMUL.value, OpFamily.SOFTMAX.value})
_NEVER_SPLIT = frozenset({OpFamily.NORMALIZATION.value, OpFamily.EMBEDDING.value})
_TP_SUBMODULE = re.compile(
    r"(?:^|[/._])(?:attn|attention|self_attn|mlp|ffn|feed_forward|fc1|fc2|intermediate)"
    r"(?=$|[/._])")


def tp_splits(layer: LayerTimeEstimate, *, in_block: bool) -> bool:
    """Whether Megatron's TP divides `layer`'s work over the tp GPUs."""
    if layer.family in _NEVER_SPLIT:
        return False
    if layer.family in _ALWAYS_SPLIT:
        return True
    return in_block and _TP_SUBMODULE.search(layer.name) is not None


def _region(layers: Sequence[LayerTimeEstimate], *, in_block: bool) -> RegionTime:
    split = sum((layer.total_ms for layer in layers if tp_splits(layer, in_block=in_block)), 0.0)
    replicated = sum((layer.total_ms for layer in layers
                      if not tp_splits(layer, in_block=in_block)), 0.0)
    return RegionTime(tp_split_ms=split, replicated_ms=replicated)


def _with_host_waits(regions: tuple[RegionTime, RegionTime, RegionTime], compute_ms: float
                     ) -> tuple[RegionTime, RegionTime, RegionTime]:
    """`regions` (kernel time per layer) with the GPU's waits for the host (`step.host`: what
    the event-timed forward + backward holds beyond the kernels) added as replicated time in
    proportion to each region: every tensor-parallel rank's host issues all of its region's
    ops, and a pipeline stage's host only its own."""
    kernels = sum(r.total_ms for r in regions)
    waits = compute_ms - kernels
    if waits <= 0 or kernels <= 0:
        return regions
    pre, blocks, post = (RegionTime(r.tp_split_ms, r.replicated_ms + waits * r.total_ms / kernels)
                         for r in regions)
    return pre, blocks, post


def split_from_estimate(estimate: DeviceStepEstimate) -> SingleGpuSplit:
    """The estimate's step cut into embedding / blocks / output regions and TP-split /
    replicated layers; `InvalidRequestError` when the layer names carry no blocks."""
    in_block = [rollup.block_of(layer.name) != rollup.OUTSIDE_BLOCKS
                for layer in estimate.layers]
    if not any(in_block):
        raise InvalidRequestError("model", "the layer names carry no repeated blocks "
                                  "(transformer layers): tensor and pipeline parallelism "
                                  "cannot be priced")
    first = in_block.index(True)
    last = len(in_block) - 1 - in_block[::-1].index(True)
    layers = estimate.layers
    pre = _region(layers[:first], in_block=False)
    blocks = _region([x for x, b in zip(layers, in_block, strict=True) if b], in_block=True)
    # Layers between blocks but outside any (rare) are counted with the blocks' replicated part.
    stray = [x for x, b in zip(layers[first:last + 1], in_block[first:last + 1], strict=True)
             if not b]
    blocks = RegionTime(blocks.tp_split_ms, blocks.replicated_ms + sum(x.total_ms for x in stray))
    post = _region(layers[last + 1:], in_block=False)
    pre, blocks, post = _with_host_waits(
        (pre, blocks, post), estimate.forward_ms + estimate.backward_ms)
    return SingleGpuSplit(
        batch=estimate.samples_per_step, forward_ms=estimate.forward_ms,
        backward_ms=estimate.backward_ms, optimizer_ms=estimate.optimizer_ms,
        gradient_bytes=estimate.memory.reduced_gradients_bytes, pre=pre, blocks=blocks, post=post)


def model_dims_from_graph(graph: ModelGraph, *, precision: str) -> ModelDims:
    """Hidden size (a block's first norm's width), sequence (the bound dim), block count and
    heads (the attention softmax's [batch, heads, seq, seq]) of a transformer graph."""
    if precision not in ELEMENT_BYTES:
        raise InvalidRequestError("precision", f"must be one of {', '.join(ELEMENT_BYTES)}, "
                                  f"got {precision!r}")
    sequence = graph.dim_bindings.get(SEQUENCE_DIM)
    if sequence is None:
        raise InvalidRequestError(f"dims.{SEQUENCE_DIM}", "must be bound (e.g. --dim "
                                  "sequence=1024): TP and PP messages scale with it")
    names = [rollup.block_of(layer.name) for layer in graph.layers]
    blocks = [n for n in dict.fromkeys(names) if n != rollup.OUTSIDE_BLOCKS]
    inside = [layer for layer, n in zip(graph.layers, names, strict=True)
              if n != rollup.OUTSIDE_BLOCKS]
    hidden = _hidden_width(inside)
    if not blocks or hidden is None:
        raise InvalidRequestError("model", "no transformer blocks with a normalization or "
                                  "linear layer found: the hidden size cannot be read from "
                                  "the graph")
    softmax = [layer for layer in inside
               if layer.family is OpFamily.SOFTMAX and len(layer.outputs[0].shape) == 4]
    return ModelDims(hidden=hidden, sequence=sequence, blocks=len(blocks),
                     element_bytes=ELEMENT_BYTES[precision],
                     heads=softmax[0].outputs[0].shape[1] if softmax else None)


def _hidden_width(block_layers: Sequence[Layer]) -> int | None:
    """The residual stream's width: what a block's first normalization reads, or, where the
    norm is spelled out op by op (RMSNorm as Pow, ReduceMean, ... in Llama-shaped graphs),
    what its first linear layer reads ([batch, sequence, hidden] @ [hidden, out])."""
    for layer in block_layers:
        if layer.family is OpFamily.NORMALIZATION:
            return layer.inputs[0].shape[-1]
    for layer in block_layers:
        if layer.family is OpFamily.MATMUL and len(layer.inputs[0].shape) == 3:
            return layer.inputs[0].shape[-1]
    return None
