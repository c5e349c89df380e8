"""Pure: Node and Pod objects → GPU inventory per GPU type (the estimator's `inventory`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gpuplan_operator.core import gpu_accounting


@dataclasses.dataclass(frozen=True)
class GpuPool:
    """GPUs of one type in the cluster: per node, nodes, and free now."""

    gpu_type: str
    gpus_per_node: int
    nodes: int
    free_gpus: int

    def to_request(self) -> dict[str, Any]:
        """The estimator's `inventory` entry."""
        return dataclasses.asdict(self)


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def gpu_requests_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """GPUs requested by bound, non-terminal pods, per node name."""
    used: dict[str, int] = {}
    for held in filter(None, map(gpu_accounting.held_gpus, pods)):
        node, gpus = held
        used[node] = used.get(node, 0) + gpus
    return used


def build_inventory(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[GpuPool]:
    """One pool per `nvidia.com/gpu.product`, over Ready, schedulable nodes with GPUs."""
    used = gpu_requests_by_node(pods)
    per_type: dict[str, list[tuple[int, int]]] = {}
    for node in nodes:
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        gpu_type = gpu_accounting.node_product(node)
        alloc = gpu_accounting.node_allocatable_gpus(node) or 0
        if not gpu_type or alloc == 0 or spec.get("unschedulable") or not _ready(node):
            continue
        free = max(alloc - used.get(meta.get("name", ""), 0), 0)
        per_type.setdefault(gpu_type, []).append((alloc, free))
    return [
        GpuPool(gpu_type=t, gpus_per_node=max(a for a, _ in v), nodes=len(v),
                free_gpus=sum(f for _, f in v))
        for t, v in sorted(per_type.items())
    ]


Capacity = tuple[tuple[str, int, int], ...]
"""What a plan's feasibility depends on: (GPU type, GPUs per node, nodes) per pool, sorted."""


def capacity(pools: Iterable[GpuPool]) -> Capacity:
    """The pools without their free GPUs: the estimator's feasibility ignores them (a plan is
    for the cluster, not for this instant), so pods starting and ending do not change it."""
    return tuple(sorted((p.gpu_type, p.gpus_per_node, p.nodes) for p in pools))
