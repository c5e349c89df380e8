"""Pure GPU inventory: v1.Node and v1.Pod dicts → per-node GPU type, allocatable and free GPUs.

Free GPUs on a node = allocatable `nvidia.com/gpu` minus the effective GPU requests of the
non-terminal pods bound there (`spec.nodeName`), the same accounting the kubelet admits against.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from gpuplan_operator.core import gpu_accounting


@dataclass(frozen=True, slots=True)
class NodeGpus:
    """What the extender knows about one node; None marks missing or unusable data."""

    name: str
    product: str | None
    allocatable_gpus: int | None
    used_gpus: int

    @property
    def free_gpus(self) -> int | None:
        """Allocatable minus used GPUs, never negative; None when allocatable is unknown."""
        if self.allocatable_gpus is None:
            return None
        return max(self.allocatable_gpus - self.used_gpus, 0)


@dataclass(frozen=True, slots=True)
class PodUsage:
    """GPUs a bound, non-terminal pod holds on its node."""

    node_name: str
    gpus: int


@dataclass(frozen=True)
class NodeIndex:
    """Nodes grouped into classes of equal (type, allocatable, used GPUs).

    A filter or score depends only on a node's class, and a cluster has few classes (types ×
    GPU counts), so a request evaluates each class once and then only looks names up: this
    keeps a 5,000-name request in the low milliseconds in pure Python."""

    classes: tuple[NodeGpus, ...]
    class_of: Mapping[str, int]


@dataclass(frozen=True)
class Snapshot:
    """Immutable inventory of GPU nodes that one request decides on; build it with `make_snapshot`.

    `fresh_at_s` is the clock reading (seconds) of the last moment both watches were known to be
    current.
    """

    nodes: Mapping[str, NodeGpus]
    fresh_at_s: float
    index: NodeIndex


def index_nodes(nodes: Mapping[str, NodeGpus]) -> NodeIndex:
    """Group nodes into classes of equal (type, allocatable, used GPUs)."""
    ids: dict[tuple[str | None, int | None, int], int] = {}
    classes: list[NodeGpus] = []
    class_of: dict[str, int] = {}
    for name, node in nodes.items():
        key = (node.product, node.allocatable_gpus, node.used_gpus)
        cid = ids.get(key)
        if cid is None:
            cid = ids[key] = len(classes)
            classes.append(NodeGpus("", *key))
        class_of[name] = cid
    # A plain dict: read-only by contract, and its .get is ~2× faster than a mappingproxy's.
    return NodeIndex(classes=tuple(classes), class_of=class_of)


def make_snapshot(nodes: Mapping[str, NodeGpus], fresh_at_s: float) -> Snapshot:
    """A read-only Snapshot of `nodes` with its class index."""
    frozen = nodes if isinstance(nodes, MappingProxyType) else MappingProxyType(dict(nodes))
    return Snapshot(nodes=frozen, fresh_at_s=fresh_at_s, index=index_nodes(frozen))


def node_gpus(node: Mapping[str, Any], used_gpus: int = 0) -> NodeGpus:
    """Read GPU type and allocatable GPUs from a v1.Node dict; never raises on bad data."""
    meta = node.get("metadata")
    name = meta.get("name", "") if isinstance(meta, dict) else ""
    try:
        product = gpu_accounting.node_product(node)
    except (AttributeError, TypeError):  # labels of the wrong type: no usable label
        product = None
    try:
        allocatable = gpu_accounting.node_allocatable_gpus(node)
    except (AttributeError, TypeError):  # status or allocatable of the wrong type
        allocatable = None
    return NodeGpus(name=str(name), product=product, allocatable_gpus=allocatable,
                    used_gpus=used_gpus)


def pod_key(pod: Mapping[str, Any]) -> str:
    """A pod's key in the inventory: its uid, else namespace/name."""
    meta = pod.get("metadata")
    if not isinstance(meta, dict):
        return "/"
    return str(meta.get("uid") or f"{meta.get('namespace', '')}/{meta.get('name', '')}")


def pod_usage(pod: Mapping[str, Any]) -> PodUsage | None:
    """The GPUs a pod holds, or None if it holds none (unbound, terminal, no GPUs, malformed).

    A malformed quantity or shape cannot have passed apiserver validation, so it counts as zero
    rather than stopping the watch that delivered it."""
    try:
        held = gpu_accounting.held_gpus(pod)
    except (AttributeError, TypeError, ValueError):
        return None
    return None if held is None else PodUsage(node_name=held[0], gpus=held[1])


def used_by_node(usages: Iterable[PodUsage]) -> dict[str, int]:
    """GPUs held per node name, summed over the pods' usages."""
    used: dict[str, int] = {}
    for usage in usages:
        used[usage.node_name] = used.get(usage.node_name, 0) + usage.gpus
    return used


def build_snapshot(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], fresh_at_s: float
) -> Snapshot:
    """A snapshot from full Node and Pod lists (what a relist produces)."""
    used = used_by_node(u for u in (pod_usage(p) for p in pods) if u is not None)
    views = {}
    for node in nodes:
        view = node_gpus(node)
        views[view.name] = NodeGpus(view.name, view.product, view.allocatable_gpus,
                                    used.get(view.name, 0))
    return make_snapshot(MappingProxyType(views), fresh_at_s)
