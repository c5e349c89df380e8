"""Expert parallelism (EP) for mixture-of-experts models (issue #34), as Megatron-core and
DeepSpeed-MoE run it (Rajbhandari et al. 2022, "DeepSpeed-MoE", §4; Megatron-core's
`MoEAlltoAllTokenDispatcher`).

Each MoE layer's E experts are sharded over `ep` ranks taken from the data-parallel group (ep
divides dp and E; E/ep experts per rank). Megatron-core's rank order "tp-cp-ep-dp-pp" puts an
EP group's members next to each other after the TP ranks, so it fits a node when tp x ep <= the
node's GPUs; the expert-data-parallel group (the dp/ep ranks holding the same experts) strides
tp x ep.

- Memory: the experts' weights, gradients and optimizer state on a rank are 1/ep of the
  model's (dense and attention weights unchanged); ZeRO already spreads sharded states over
  dp = ep x dp/ep ranks, so only the unsharded ones shrink. The all-to-all's send and receive
  buffers (one MoE layer's dispatched tokens each) are counted beside the activations; the
  router's logits are in the graph's activations already.
- Time: each MoE layer runs an all-to-all to dispatch its tokens to their experts' ranks and
  one to combine them back, in forward and again in backward: 4 per layer and micro-batch.
  Each rank sends (ep-1)/ep of its tokens x k x capacity factor x hidden; they are on the
  critical path (Megatron does not overlap them by default), so all of it is exposed. Expert
  gradients all-reduce only over the dp/ep replicas that hold the same experts.

The compute is unchanged: on average a rank runs as many (token, expert) pairs with or without
EP; an unbalanced router's slowest rank is not modelled (as in `graph.hf_blocks`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpuplan_estimator.core.layers import Layer, ModelGraph, OpFamily
from gpuplan_estimator.parallel.scaling import UNKNOWN_INTRA_NODE_GBPS, ScalingModel

ALLTOALLS_PER_MOE_LAYER = 4
"""Dispatch and combine in forward, their gradients in backward."""
EXPERT_WEIGHT_RANK = 3
"""An expert MatMul's weight is [experts, in, out]: the experts run as one batched matmul."""
TOKEN_DIMS = ("batch", "sequence")
"""The graph's bound dims whose product is the tokens a step routes."""
DISPATCH_BUFFERS = 2
"""The all-to-all's send and receive buffers of one MoE layer at a time."""


@dataclass(frozen=True)
class ExpertDims:
    """What EP needs of a mixture-of-experts graph."""

    experts: int  # E, per MoE layer
    moe_layers: int  # blocks with experts
    expert_parameter_count: int  # every MoE layer's expert weights together
    parameter_count: int  # the whole model's
    routed_per_token: float  # rows dispatched per token: top-k x capacity factor
    hidden: int  # the dispatched rows' width
    tokens_per_sample: int  # the bound sequence (1 without one)

    @property
    def expert_fraction(self) -> float:
        """The experts' share of the model's parameters."""
        return self.expert_parameter_count / self.parameter_count if self.parameter_count else 0.0

    def local_parameter_fraction(self, ep: int) -> float:
        """A rank's parameters under `ep` over an unsharded rank's: dense + experts / ep."""
        return 1.0 - self.expert_fraction + self.expert_fraction / ep

    def dispatch_bytes(self, micro_batch: int, element_bytes: int) -> int:
        """One MoE layer's dispatched rows of a micro-batch, in bytes: what one all-to-all
        moves in and out of a rank, the (ep-1)/ep of it that leaves."""
        rows = math.ceil(micro_batch * self.tokens_per_sample * self.routed_per_token)
        return rows * self.hidden * element_bytes


def expert_dims(graph: ModelGraph) -> ExpertDims | None:
    """The graph's experts, read from its batched expert MatMuls (a 3-D weight, E > 1); None
    for a dense model. A MoE layer is one dispatched tensor [E, C, hidden] its first expert
    MatMuls read (the later ones read what the earlier ones made)."""
    expert_layers = [layer for layer in graph.layers if _is_expert_matmul(layer)]
    if not expert_layers:
        return None
    experts = expert_layers[0].inputs[1].shape[0]
    made = _made_by_experts(graph, {layer.name for layer in expert_layers}, experts)
    dispatched = list({layer.inputs[0].name: layer.inputs[0] for layer in expert_layers
                       if layer.inputs[0].name not in made}.values())
    tokens = math.prod(graph.dim_bindings.get(d, 1) for d in TOKEN_DIMS)
    batch = graph.dim_bindings.get(TOKEN_DIMS[0], 1)
    first = dispatched[0]
    return ExpertDims(
        experts=experts, moe_layers=len(dispatched),
        expert_parameter_count=sum(layer.parameter_count for layer in expert_layers),
        parameter_count=graph.parameter_count,
        routed_per_token=first.shape[0] * first.shape[1] / tokens, hidden=first.shape[-1],
        tokens_per_sample=tokens // batch)


def _is_expert_matmul(layer: Layer) -> bool:
    if layer.family is not OpFamily.MATMUL or len(layer.inputs) < 2:
        return False
    weight = layer.inputs[1]
    return (weight.name in layer.parameter_inputs and len(weight.shape) == EXPERT_WEIGHT_RANK
            and weight.shape[0] > 1)


def _made_by_experts(graph: ModelGraph, names: set[str], experts: int) -> set[str]:
    """Tensors the expert MatMuls make, and what per-expert ops ([E, ...] in, [E, ...] out:
    the gate's activation, its product with the up projection) make of them."""
    made: set[str] = set()
    for layer in graph.layers:
        per_expert = all(len(t.shape) == EXPERT_WEIGHT_RANK and t.shape[0] == experts
                         for t in layer.outputs)
        if layer.name in names or (per_expert and any(t.name in made for t in layer.inputs)):
            made.update(t.name for t in layer.outputs)
    return made


def alltoall_ms(message_bytes: int, *, ep: int, members_per_node: int, intra_node_gbps: float,
                scaling: ScalingModel) -> float:
    """One all-to-all of a rank's `message_bytes` over `ep` ranks: it sends (ep-1)/ep of them,
    on the node's link, or the network's when the group crosses nodes (the slower link sets
    the pace, as for the all-reduce); one hop latency per peer."""
    if ep <= 1 or message_bytes <= 0:
        return 0.0
    link_gbps = intra_node_gbps if intra_node_gbps > 0 else UNKNOWN_INTRA_NODE_GBPS
    if ep > members_per_node:
        link_gbps = min(link_gbps, scaling.inter_node_gbps)
    sent = message_bytes * (ep - 1) / ep
    seconds = sent / (scaling.bandwidth_efficiency * link_gbps * 1e9)
    return (seconds + (ep - 1) * scaling.hop_latency_us * 1e-6) * 1000.0


def expert_degrees(experts: int, dp: int) -> tuple[int, ...]:
    """The expert-parallel degrees above 1 the planner tries: divisors of both E and dp."""
    return tuple(d for d in range(2, min(experts, dp) + 1) if experts % d == 0 and dp % d == 0)


def ep_problems(ep: int, experts: ExpertDims | None) -> list[tuple[str, str]]:
    """(field, message) for every reason `ep` cannot split this model's experts (that ep
    divides dp, `layouts.layout_problems` checks)."""
    if ep == 1:
        return []
    if experts is None:
        return [("ep", f"{ep} needs a mixture-of-experts model; this one is dense (no expert "
                 "layers)")]
    if experts.experts % ep:
        return [("ep", f"{ep} does not divide the {experts.experts} experts per layer")]
    return []
