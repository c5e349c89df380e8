"""Pure: Node and Pod objects → GPU inventory per GPU type (the estimator's `inventory`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gpuplan_operator import resources

TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})


@dataclasses.dataclass(frozen=True)
class GpuPool:
    gpu_type: str
    gpus_per_node: int
    nodes: int
    free_gpus: int

    def to_request(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def gpu_quantity(value: object) -> int:
    """nvidia.com/gpu is an integer extended resource ("8"); anything else counts as 0."""
    try:
        return max(int(str(value)), 0)
    except ValueError:
        return 0


def _ready(node: Mapping[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def gpu_requests_by_node(pods: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """GPUs requested by bound, non-terminal pods, per node name."""
    used: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        for c in (pod.get("spec") or {}).get("containers") or []:
            res = c.get("resources") or {}
            want = (res.get("requests") or {}).get(resources.GPU_RESOURCE)
            if want is None:
                want = (res.get("limits") or {}).get(resources.GPU_RESOURCE, 0)
            used[node] = used.get(node, 0) + gpu_quantity(want)
    return used


def build_inventory(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]
) -> list[GpuPool]:
    """One pool per `nvidia.com/gpu.product`, over Ready, schedulable nodes with GPUs."""
    used = gpu_requests_by_node(pods)
    per_type: dict[str, list[tuple[int, int]]] = {}
    for node in nodes:
        meta, spec = node.get("metadata") or {}, node.get("spec") or {}
        gpu_type = (meta.get("labels") or {}).get(resources.GPU_PRODUCT_LABEL)
        alloc = gpu_quantity(((node.get("status") or {}).get("allocatable") or {})
                             .get(resources.GPU_RESOURCE, 0))
        if not gpu_type or alloc == 0 or spec.get("unschedulable") or not _ready(node):
            continue
        free = max(alloc - used.get(meta.get("name", ""), 0), 0)
        per_type.setdefault(gpu_type, []).append((alloc, free))
    return [
        GpuPool(gpu_type=t, gpus_per_node=max(a for a, _ in v), nodes=len(v),
                free_gpus=sum(f for _, f in v))
        for t, v in sorted(per_type.items())
    ]
