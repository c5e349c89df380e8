"""Pure: what a fused attention kernel changes in a step, per `graph.fusion`'s attention units.

A fused attention (PyTorch's `scaled_dot_product_attention` with its flash or memory-efficient
backend; Dao et al., FlashAttention, NeurIPS 2022, §3.1) computes softmax(Q·Kᵀ·scale + mask)·V
tile by tile in on-chip memory. Against the same core run op by op (`options.EAGER_ATTENTION`):

- forward: the scale, mask, softmax and dropout run inside the kernel (free here); its two
  matrix products are priced as the GEMMs they are, each at the efficiency its unfused GEMM
  reaches against its roofline, but against the roofline of the bytes it moves in the fused
  kernel: without the [queries, keys] scores, which stay on chip (`workload.FUSED_IO_BYTES`).
  In half precision with head dim 64 the scores' round trip is most of an unfused GEMM's
  roofline on an A100 or H100 (3-4x its compute time);
- backward: the products' four gradient GEMMs, plus Q·Kᵀ once more (the scores are recomputed
  from the saved statistics instead of being stored, FlashAttention §3.1 "Recomputation"),
  again without the scores' traffic; the softmax, mask and scale gradients run inside that
  kernel too;
- memory: what entered the core (Q, K, V, a mask), the output and one logsumexp per query row
  are kept for backward, never the [batch, heads, queries, keys] scores or probabilities (or a
  dropout mask: it is regenerated from the RNG state), and inference never holds them either.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from gpuplan_estimator.core import options, workload
from gpuplan_estimator.core.layers import ModelGraph, TensorInfo
from gpuplan_estimator.core.workload import WorkItem

ATTENTION_PATTERN = "attention"
"""`graph.fusion`'s pattern of a whole attention core (scores through ·V)."""
SCORES_PATTERN = "attention_scores"
"""`graph.fusion`'s pattern of scores through Softmax whose ·V product it could not find (the
probabilities escape, or feed something else): no fused kernel computes it."""


@dataclass(frozen=True)
class FusedAttention:
    """The layers, tensors and saved state a fused attention changes in one graph."""

    folded: frozenset[str] = frozenset()
    """Layers computed inside the fused kernel: scales, mask, softmax, dropout."""
    recomputed: frozenset[str] = frozenset()
    """Q·Kᵀ layers whose forward GEMM runs again in backward."""
    internal: frozenset[str] = frozenset()
    """Tensors that never reach memory: scores, masked scores, probabilities."""
    kept: Mapping[str, tuple[TensorInfo, ...]] = field(
        default_factory=lambda: MappingProxyType({}))
    """Per ·V layer: everything its core keeps for the backward kernel (what entered it, the
    output and its logsumexp); the core's other layers keep nothing of their own."""
    scores_shape: Mapping[str, tuple[int, int]] = field(
        default_factory=lambda: MappingProxyType({}))
    """Per Q·Kᵀ and ·V layer: (queries, keys), the shape of the scores its GEMMs never store."""

    @functools.cached_property
    def members(self) -> frozenset[str]:
        """Every layer of a fused core: their eager saved tensors give way to `kept` (cached:
        read once per layer of the step, and a 70B graph has tens of thousands)."""
        return self.folded | self.recomputed | frozenset(self.kept)


EAGER = FusedAttention()
"""Nothing fused: every op of the attention core as the graph spells it out."""


def fused_attention(graph: ModelGraph, attention: str) -> FusedAttention:
    """What `attention` ("eager" or "fused", `options.ATTENTIONS`) changes in `graph`."""
    if attention == options.EAGER_ATTENTION:
        return EAGER
    if attention != options.FUSED_ATTENTION:
        raise ValueError(f"attention must be one of {options.ATTENTIONS}, got {attention!r}")
    by_name = {layer.name: layer for layer in graph.layers}
    folded: set[str] = set()
    recomputed: set[str] = set()
    internal: set[str] = set()
    kept: dict[str, tuple[TensorInfo, ...]] = {}
    shape: dict[str, tuple[int, int]] = {}
    for unit in graph.units:
        if unit.pattern != ATTENTION_PATTERN:
            continue
        members = [by_name[name] for name in unit.layer_names]  # in graph order
        scores = next(m for m in members if m.op_type == "MatMul")
        output = members[-1]
        folded.update(m.name for m in members if m is not scores and m is not output)
        recomputed.add(scores.name)
        made_inside = {t.name for m in members[:-1] for t in m.outputs}
        internal.update(made_inside)
        # The kernel's backward reads what entered it (Q, K, V, a mask, scalars), once each,
        # whichever member read it in eager.
        entered = {t.name: t for m in members for t in m.inputs
                   if t.name not in made_inside and t.name not in m.parameter_inputs}
        queries, keys = scores.outputs[0].shape[-2:]
        shape[scores.name] = shape[output.name] = (queries, keys)
        out = output.outputs[0]
        # One float per query row; counted at the activation width like every saved tensor
        # (it is fp32 in half precision too, 1/head_dim of the output either way).
        logsumexp = TensorInfo(f"{out.name}#logsumexp", out.shape[:-1], out.dtype)
        kept[output.name] = (*entered.values(), out, logsumexp)
    return FusedAttention(frozenset(folded), frozenset(recomputed), frozenset(internal),
                          MappingProxyType(kept), MappingProxyType(shape))


def without_scores_traffic(item: WorkItem, queries: int, keys: int) -> WorkItem:
    """`item` (a GEMM of a fused core, forward or backward) with the bytes it moves inside the
    fused kernel: its operands and result less the [queries, keys] matrix, which stays on chip.
    A GEMM with no such matrix, or another kernel, is returned as it is. (A head dim equal to
    the sequence makes Q look like the scores too; such a core is tiny either way.)

    A float32 core runs PyTorch's memory-efficient kernel in its own fp32 arithmetic whatever
    `allow_tf32` says, so its GEMMs lose a TF32 math mode: on the H200, BERT-large at batch 4
    ran `fmha_cutlassF_f32` for 4.80 ms under fp32 and 4.89 ms under tf32, its backward 8.98
    and 9.06 ms (`docs/gpu-steps/2026-11-27-h200b/steps.jsonl`, `instrumented`)."""
    if item.kernel != "gemm":
        return item
    m, k, n = item.dims["m"], item.dims["k"], item.dims["n"]
    matrices = ((m, k), (k, n), (m, n))
    scores = {(queries, keys), (keys, queries)}
    total = sum(rows * cols for rows, cols in matrices)
    off_chip = sum(rows * cols for rows, cols in matrices if (rows, cols) not in scores)
    if off_chip == total or total == 0:
        return item
    attributes = {k: v for k, v in item.attributes.items() if k != "math"}
    return replace(item, attributes=MappingProxyType({
        **attributes, workload.FUSED_IO_BYTES: item.bytes_moved * off_chip // total}))


@dataclass(frozen=True)
class AttentionReport:
    """How an estimate priced the graph's attention, and whether that is what was asked."""

    requested: str
    """`options.ATTENTIONS`: what the estimate was asked for."""
    cores: int
    """Whole attention cores (scores through ·V) `graph.fusion` found."""
    fused_cores: int
    """Cores priced as one fused kernel: every core under fused attention, none under eager."""
    unfused_scores: int
    """Softmaxes over attention scores whose ·V product was not found: priced eager always."""
    warning: str | None
    """Said when fused attention was asked for and some or all attention stayed eager."""

    def as_dict(self) -> dict[str, object]:
        """The estimate JSON's `attention` object (docs/estimate-json.md)."""
        return {"requested": self.requested, "cores": self.cores,
                "fused_cores": self.fused_cores, "unfused_scores": self.unfused_scores,
                "warning": self.warning}


def attention_report(graph: ModelGraph, attention: str) -> AttentionReport:
    """What `attention` did to `graph`'s attention, with a warning when fused attention was
    asked for and no core (or not every one) was found: without it an estimate asked for
    fused would silently give the eager price and memory."""
    if attention not in options.ATTENTIONS:
        raise ValueError(f"attention must be one of {options.ATTENTIONS}, got {attention!r}")
    cores = sum(unit.pattern == ATTENTION_PATTERN for unit in graph.units)
    scores_only = sum(unit.pattern == SCORES_PATTERN for unit in graph.units)
    fused = attention == options.FUSED_ATTENTION
    warning = None
    if fused and cores == 0:
        warning = ("fused attention was asked for, but no attention core (Q·Kᵀ, scale and mask, "
                   "Softmax, ·V) was found in the graph: its attention is priced eager, op by "
                   "op with the scores in memory")
    elif fused and scores_only:
        warning = (f"{scores_only} softmax(es) over attention scores have no ·V product a "
                   f"fused kernel could take (their probabilities are read elsewhere): priced "
                   f"eager beside {cores} fused core(s)")
    return AttentionReport(attention, cores, cores if fused else 0, scores_only, warning)
