"""Builders of v1.Node / v1.Pod dicts and ExtenderArgs bodies, shaped as kube-scheduler sends them.

Used by the tests, the load benchmark and the integration tests (kueue's `MakeX(...).Obj()` idea,
as plain functions).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuplan_operator.core import annotations as plan_keys
from gpuplan_operator.core.gpu_accounting import GPU_PRODUCT_LABEL, GPU_RESOURCE


def make_node(name: str, product: str | None = None, gpus: int | None = None) -> dict[str, Any]:
    """A v1.Node as the apiserver returns it; None leaves the label / resource out."""
    labels = {"kubernetes.io/hostname": name}
    if product is not None:
        labels[GPU_PRODUCT_LABEL] = product
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if gpus is not None:
        resources[GPU_RESOURCE] = str(gpus)
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": "1",
                     "labels": labels, "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {},
        "status": {"capacity": dict(resources), "allocatable": dict(resources),
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def make_pod(
    name: str,
    *,
    gpus: int | None = None,
    gpu_type: str | None = None,
    gpu_count: str | None = None,
    node_name: str | None = None,
    phase: str = "Pending",
    namespace: str = "default",
    use_limits: bool = True,
    extra_annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A v1.Pod; `gpus` goes into limits (requests default to them) unless `use_limits=False`."""
    notes: dict[str, str] = dict(extra_annotations or {})
    if gpu_type is not None:
        notes[plan_keys.GPU_TYPE] = gpu_type
    if gpu_count is not None:
        notes[plan_keys.GPU_COUNT] = gpu_count
    resources: dict[str, Any] = {}
    if gpus is not None:
        resources["limits" if use_limits else "requests"] = {GPU_RESOURCE: str(gpus)}
    spec: dict[str, Any] = {
        "containers": [{"name": "trainer", "image": "trainer:1", "resources": resources}],
        "schedulerName": "gpuplan-scheduler",
    }
    if node_name is not None:
        spec["nodeName"] = node_name
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}",
                     "resourceVersion": "1", "annotations": notes or None},
        "spec": spec,
        "status": {"phase": phase},
    }


def extender_args(pod: Mapping[str, Any], node_names: Sequence[str]) -> dict[str, Any]:
    """ExtenderArgs as a node-cache-capable scheduler sends it (Go names, `Nodes: null`)."""
    return {"Pod": dict(pod), "Nodes": None, "NodeNames": list(node_names)}


def extender_args_full(
    pod: Mapping[str, Any], nodes: Sequence[Mapping[str, Any]]
) -> dict[str, Any]:
    """ExtenderArgs without nodeCacheCapable: full Node objects, `NodeNames: null`."""
    return {"Pod": dict(pod), "Nodes": {"metadata": {}, "items": [dict(n) for n in nodes]},
            "NodeNames": None}
