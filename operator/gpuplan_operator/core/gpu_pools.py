"""Pure: Node and Pod objects → GPU inventory per GPU type (the estimator's `inventory`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gpuplan_operator.core import gpu_accounting, node_gpus


@dataclasses.dataclass(frozen=True)
class ClusterGpuPool:
    """GPUs of one type in the cluster: per node, nodes, and free now.

    A MIG pool counts instances, one per pod (`node_gpus`): `gpus_per_node` 1 and `nodes` the
    instances, so a plan of N instances is N pods that talk over the network, never N devices
    in one process.
    """

    gpu_type: str
    gpus_per_node: int
    nodes: int
    free_gpus: int
    resource: str = gpu_accounting.GPU_RESOURCE
    """What the pods request (`nvidia.com/mig-<profile>` on mixed-strategy MIG nodes)."""
    node_labels: tuple[tuple[str, str], ...] = ()
    """Labels steering pods to the pool's nodes; empty: the GFD product label is `gpu_type`."""

    def to_request(self) -> dict[str, Any]:
        """The estimator's `inventory` entry."""
        return {"gpu_type": self.gpu_type, "gpus_per_node": self.gpus_per_node,
                "nodes": self.nodes, "free_gpus": self.free_gpus}

    def extender_places(self) -> bool:
        """Whether gpuplan-scheduler's extender can place the pool's pods: it reads only the
        GFD product label and `nvidia.com/gpu` (whole GPUs, single-strategy MIG); pods of
        other pools (mixed-strategy MIG, GKE labels) keep the default scheduler."""
        return self.resource == gpu_accounting.GPU_RESOURCE and not self.node_labels

    def selector(self) -> tuple[tuple[str, str], ...]:
        """The node labels a pod of this pool must match."""
        return self.node_labels or ((gpu_accounting.GPU_PRODUCT_LABEL, self.gpu_type),)


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def gpu_requests_by_node(pods: Iterable[Mapping[str, Any]],
                         resource: str = gpu_accounting.GPU_RESOURCE) -> dict[str, int]:
    """`resource` requested by bound, non-terminal pods, per node name."""
    used: dict[str, int] = {}
    for pod in pods:
        held = gpu_accounting.held_gpus(pod, resource)
        if held is not None:
            used[held[0]] = used.get(held[0], 0) + held[1]
    return used


def _schedulable(node: Mapping[str, Any]) -> bool:
    return not (node.get("spec") or {}).get("unschedulable") and _ready(node)


def build_inventory(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[ClusterGpuPool]:
    """One pool per GPU type (`node_gpus.GpuOffer.gpu_type`), over Ready, schedulable nodes;
    shared GPUs are left out (`excluded_nodes` says which)."""
    pods = list(pods)
    used: dict[str, dict[str, int]] = {}
    per_type: dict[str, list[tuple[node_gpus.GpuOffer, int]]] = {}
    for node in filter(_schedulable, nodes):
        name = (node.get("metadata") or {}).get("name", "")
        for offer in node_gpus.node_gpus(node).offers:
            if offer.resource not in used:
                used[offer.resource] = gpu_requests_by_node(pods, offer.resource)
            free = max(offer.allocatable - used[offer.resource].get(name, 0), 0)
            per_type.setdefault(offer.gpu_type, []).append((offer, free))
    return [_pool(gpu_type, offers) for gpu_type, offers in sorted(per_type.items())]


def _pool(gpu_type: str, offers: list[tuple[node_gpus.GpuOffer, int]]) -> ClusterGpuPool:
    first = offers[0][0]
    free = sum(f for _, f in offers)
    default_selector = ClusterGpuPool(gpu_type, 0, 0, 0).selector()
    labels = () if first.node_labels == default_selector else first.node_labels
    if first.per_pod == 1:
        # One device per pod: every instance is a "node" of one.
        return ClusterGpuPool(gpu_type, 1, sum(o.allocatable for o, _ in offers), free,
                       first.resource, labels)
    return ClusterGpuPool(gpu_type, max(o.allocatable for o, _ in offers), len(offers), free,
                   first.resource, labels)


def excluded_nodes(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """Schedulable nodes whose GPUs plans leave out, with why (shared GPUs), by node name."""
    out: dict[str, str] = {}
    for node in filter(_schedulable, nodes):
        why = node_gpus.node_gpus(node).excluded
        if why:
            out[str((node.get("metadata") or {}).get("name", ""))] = why
    return out


def describe_excluded(excluded: Mapping[str, str], limit: int = 3) -> str:
    """E.g. "2 node(s) with shared GPUs left out of plans: l4-ts-0 (time-slicing ...), ..."."""
    if not excluded:
        return ""
    named = ", ".join(f"{n} ({why})" for n, why in sorted(excluded.items())[:limit])
    more = f" and {len(excluded) - limit} more" if len(excluded) > limit else ""
    return (f"{len(excluded)} node(s) with shared GPUs left out of plans (a slice is not a "
            f"whole GPU): {named}{more}")


Capacity = tuple[tuple[str, int, int], ...]
"""What a plan's feasibility depends on: (GPU type, GPUs per node, nodes) per pool, sorted."""


def capacity(pools: Iterable[ClusterGpuPool]) -> Capacity:
    """The pools without their free GPUs: the estimator's feasibility ignores them (a plan is
    for the cluster, not for this instant), so pods starting and ending do not change it."""
    return tuple(sorted((p.gpu_type, p.gpus_per_node, p.nodes) for p in pools))
