"""Pure: the gradient sums autograd runs where one tensor feeds several differentiable uses.

Backward hands a tensor one gradient per use; autograd's input buffer adds them as they arrive,
one elementwise `add` kernel per use beyond the first, at the tensor's run-time dtype. A
transformer layer's input feeds its Q, K and V projections and the residual (three sums), the
attention block's output its MLP and the residual (one), GPT-2's tanh-GELU reads its input three
times (two), and a tied embedding table takes the lm-head's gradient on top of the lookup's (one
of the whole table). The H200 profiles of run 2 count them exactly: 49 `add` kernels in the
backward of GPT-2 small and BERT-base, 97 in GPT-2 medium and BERT-large
(`docs/gpu-steps/2026-11-27-h200b/steps.jsonl`, `instrumented.backward`).

Uses are counted per input slot of every layer that differentiates into that input (its output
needs a gradient). A fused attention core is one kernel: its layers together make one use of
each tensor they read.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from types import MappingProxyType

from gpuplan_estimator.core.layers import DTYPE_BYTES, ModelGraph, OpFamily, TensorInfo
from gpuplan_estimator.core.workload import Phase, WorkItem, elementwise_dims
from gpuplan_estimator.step import autocast

ROLE = "grad_sum"
SUM_OP = "add"


def gradient_sum_items(graph: ModelGraph, needs_grad: Collection[str], compute_dtype: str,
                       dtypes: Mapping[str, str], fused_core: Collection[str] = (),
                       ) -> Mapping[str, tuple[WorkItem, ...]]:
    """Per layer name, the gradient sums of the tensors it produces (a weight's or a graph
    input's go with its first user): one `add` per differentiable use beyond the first.
    `dtypes` is `autocast.tensor_dtypes` (empty without autocast: every gradient is then at
    `compute_dtype`); `fused_core` the layers inside fused attention kernels
    (`attention.FusedAttention.members`)."""
    uses: dict[str, int] = {}
    core_reads: set[str] = set()
    tensors: dict[str, TensorInfo] = {}
    owner: dict[str, str] = {}
    for layer in graph.layers:
        for t in layer.outputs:
            owner[t.name] = layer.name
        if not any(t.name in needs_grad for t in layer.outputs):
            continue  # no gradient flows back through this layer
        for t in layer.inputs:
            if t.name not in needs_grad:
                continue
            tensors.setdefault(t.name, t)
            owner.setdefault(t.name, layer.name)
            if layer.name in fused_core:
                if t.name in core_reads:
                    continue
                core_reads.add(t.name)
            uses[t.name] = uses.get(t.name, 0) + 1
    out: dict[str, list[WorkItem]] = {}
    for name, n in uses.items():
        if n > 1:
            t = tensors[name]
            dtype = autocast.dtype_of(t, dtypes) if dtypes else compute_dtype
            item = _sum_item(t, owner[name], dtype, n - 1)
            out.setdefault(owner[name], []).append(item)
    return MappingProxyType({k: tuple(v) for k, v in out.items()})


def _sum_item(tensor: TensorInfo, layer: str, dtype: str, count: int) -> WorkItem:
    elements = tensor.elements
    return WorkItem(
        layer=layer, family=OpFamily.ELEMENTWISE, kernel="elementwise", phase=Phase.BACKWARD,
        dims=MappingProxyType(elementwise_dims(tensor, 2)), dtype=dtype, flops=elements,
        bytes_moved=3 * elements * DTYPE_BYTES[dtype], op=SUM_OP, count=count, role=ROLE)
