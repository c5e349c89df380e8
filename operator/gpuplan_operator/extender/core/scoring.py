"""Pure filter and prioritize over one inventory snapshot.

Filter: a managed pod passes only on nodes of an accepted GPU type with enough free GPUs. Reasons
carry no node name, so kube-scheduler's "0/N nodes are available: k <reason>" summary groups
them. A failure that preemption cannot cure (wrong type, too few GPUs in total) is reported as
*unresolvable*, so the scheduler does not evict pods for nothing.

Prioritize: see `packing_score`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuplan_operator.core.gpu_accounting import GPU_PRODUCT_LABEL, GPU_RESOURCE
from gpuplan_operator.extender.core.plans import PodPlan
from gpuplan_operator.extender.core.protocol import MAX_SCORE, MIN_SCORE, FilterResult
from gpuplan_operator.extender.core.snapshot import NodeGpus, Snapshot

EXACT_FIT_SCORE = MAX_SCORE
"""The pod fills the node's free GPUs exactly: no fragment is left behind."""
EMPTY_NODE_SCORE = 1
"""An untouched node the pod would not fill: kept for jobs that need a whole node."""
NEUTRAL_SCORE = 5
"""Managed pod, but the node's data is missing or the pod needs no GPUs: no opinion."""
UNMANAGED_SCORE = MIN_SCORE
"""Every node gets the same score for an unmanaged pod, so it adds nothing to the ranking."""
BEST_FIT_MIN, BEST_FIT_MAX = 2, 9
"""Range for partly used nodes that fit, fuller (smaller remainder) scoring higher."""

NOT_IN_INVENTORY = "node not in the gpuplan inventory yet"
NO_PRODUCT_LABEL = f"node has no {GPU_PRODUCT_LABEL} label"
NO_ALLOCATABLE = f"node has no allocatable {GPU_RESOURCE}"


@dataclass(frozen=True)
class Verdict:
    """Why one node cannot take the pod; `unresolvable` when evicting pods would not help."""

    reason: str
    unresolvable: bool


def packing_score(free_gpus: int, allocatable_gpus: int, requested_gpus: int) -> int:
    """Best-fit packing score in 0–10 for placing `requested_gpus` on one node.

    * 10 when the pod takes exactly the node's free GPUs (free == requested),
    * 2–9 on a partly used node, linear in how full it is left:
      2 + round(7 × (1 − remainder / allocatable)), remainder = free − requested,
    * 1 on an empty node the pod does not fill, so whole nodes stay free for whole-node jobs,
    * 0 when it does not fit, 5 (neutral) when the pod needs no GPUs or the node has none.
    """
    if requested_gpus <= 0 or allocatable_gpus <= 0:
        return NEUTRAL_SCORE
    if requested_gpus > free_gpus:
        return MIN_SCORE
    if requested_gpus == free_gpus:
        return EXACT_FIT_SCORE
    if free_gpus >= allocatable_gpus:
        return EMPTY_NODE_SCORE
    remainder_fraction = (free_gpus - requested_gpus) / allocatable_gpus
    span = BEST_FIT_MAX - BEST_FIT_MIN
    return BEST_FIT_MIN + round(span * (1.0 - remainder_fraction))


def node_verdict(node: NodeGpus | None, plan: PodPlan) -> Verdict | None:
    """None when the node can take the pod now, else the reason it cannot."""
    if node is None:
        return Verdict(NOT_IN_INVENTORY, unresolvable=False)
    accepted = plan.accepted_products
    if accepted is not None:
        if node.product is None:
            return Verdict(NO_PRODUCT_LABEL, unresolvable=True)
        if node.product.casefold() not in accepted:
            return Verdict(f"type {node.product} != planned {plan.planned_type}", True)
    if plan.gpus <= 0:
        return None
    if node.allocatable_gpus is None:
        return Verdict(NO_ALLOCATABLE, unresolvable=True)
    if node.allocatable_gpus < plan.gpus:
        return Verdict(f"{node.allocatable_gpus} allocatable GPUs < {plan.gpus} requested", True)
    free = node.free_gpus or 0
    if free < plan.gpus:
        return Verdict(f"{free} free GPUs < {plan.gpus} requested", unresolvable=False)
    return None


def filter_nodes(snapshot: Snapshot, plan: PodPlan, node_names: Sequence[str]) -> FilterResult:
    """Split the candidates into passing names and failed ones with reasons.

    Verdicts are computed once per node class (`NodeIndex`), then looked up per name."""
    index = snapshot.index
    verdicts = [node_verdict(node, plan) for node in index.classes]
    unknown = node_verdict(None, plan)
    class_of = index.class_of.get
    passed: list[str] = []
    failed: dict[str, str] = {}
    unresolvable: dict[str, str] = {}
    for name in node_names:
        cid = class_of(name)
        verdict = unknown if cid is None else verdicts[cid]
        if verdict is None:
            passed.append(name)
        elif verdict.unresolvable:
            unresolvable[name] = verdict.reason
        else:
            failed[name] = verdict.reason
    return FilterResult(passed=tuple(passed), failed=failed, failed_unresolvable=unresolvable)


def pass_through(node_names: Sequence[str]) -> FilterResult:
    """Unmanaged pods: every candidate passes, nothing fails."""
    return FilterResult(passed=tuple(node_names), failed={}, failed_unresolvable={})


def reject_all(node_names: Sequence[str], reason: str) -> FilterResult:
    """A pod whose plan is unusable (e.g. malformed annotation) fits nowhere, for one reason."""
    return FilterResult(passed=(), failed={}, failed_unresolvable=dict.fromkeys(node_names, reason))


def prioritize(
    snapshot: Snapshot | None, plan: PodPlan | None, node_names: Sequence[str]
) -> list[tuple[str, int]]:
    """Score every candidate 0–10; never raises, whatever is missing."""
    return list(zip(node_names, prioritize_scores(snapshot, plan, node_names), strict=True))


def prioritize_scores(
    snapshot: Snapshot | None, plan: PodPlan | None, node_names: Sequence[str]
) -> list[int]:
    """`prioritize` without the names: the score of each candidate, in order.

    Scores are computed once per node class and mapped to the names at C speed; no object per
    name is allocated (small ints are shared), which keeps the garbage collector quiet at
    thousands of candidates per request."""
    if plan is None:
        return [UNMANAGED_SCORE] * len(node_names)
    if snapshot is None:
        return [NEUTRAL_SCORE] * len(node_names)
    index = snapshot.index
    score_of: dict[int | None, int] = {
        cid: _node_score(node, plan) for cid, node in enumerate(index.classes)}
    score_of[None] = NEUTRAL_SCORE  # not in the inventory
    return list(map(score_of.__getitem__, map(index.class_of.get, node_names)))


def _node_score(node: NodeGpus | None, plan: PodPlan) -> int:
    if node is None or node.allocatable_gpus is None:
        return NEUTRAL_SCORE
    if node_verdict(node, plan) is not None:
        return MIN_SCORE
    return packing_score(node.free_gpus or 0, node.allocatable_gpus, plan.gpus)
