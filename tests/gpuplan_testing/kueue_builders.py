"""Builders of Kueue objects (kueue.x-k8s.io/v1beta2) for the unit and integration tests."""

from __future__ import annotations

from typing import Any

API_VERSION = "kueue.x-k8s.io/v1beta2"
GPU = "nvidia.com/gpu"
PRODUCT = "nvidia.com/gpu.product"


def resource_flavor(name: str, gpu_type: str | None = None) -> dict[str, Any]:
    """A ResourceFlavor; with `gpu_type`, its nodeLabels select that GPU product."""
    spec: dict[str, Any] = {}
    if gpu_type is not None:
        spec["nodeLabels"] = {PRODUCT: gpu_type}
    return {"apiVersion": API_VERSION, "kind": "ResourceFlavor", "metadata": {"name": name},
            "spec": spec}


class ClusterQueueBuilder:
    """`ClusterQueueBuilder("cq").flavor("l4", gpus=8).obj()`, Kueue's MakeClusterQueue style."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._groups: list[dict[str, Any]] = []
        self._reserved: list[dict[str, Any]] = []

    def flavor(self, name: str, *, gpus: int | str, covered: tuple[str, ...] = (GPU,)) -> (
            ClusterQueueBuilder):
        """Add a resource group of one flavor giving `gpus` nominal GPUs."""
        resources = [{"name": r, "nominalQuota": gpus if r == GPU else "64"} for r in covered]
        self._groups.append({"coveredResources": list(covered),
                             "flavors": [{"name": name, "resources": resources}]})
        return self

    def reserved(self, flavor: str, gpus: int) -> ClusterQueueBuilder:
        """GPUs of `flavor` held by admitted workloads (status.flavorsReservation)."""
        self._reserved.append({"name": flavor, "resources": [
            {"name": GPU, "total": str(gpus), "borrowed": "0"}]})
        return self

    def obj(self) -> dict[str, Any]:
        """The ClusterQueue; namespaceSelector {} admits every namespace (null admits none)."""
        out: dict[str, Any] = {
            "apiVersion": API_VERSION, "kind": "ClusterQueue", "metadata": {"name": self._name},
            "spec": {"namespaceSelector": {}, "resourceGroups": self._groups}}
        if self._reserved:
            out["status"] = {"flavorsReservation": self._reserved}
        return out


def local_queue(name: str, namespace: str, cluster_queue: str) -> dict[str, Any]:
    """A LocalQueue of `namespace` feeding `cluster_queue`."""
    return {"apiVersion": API_VERSION, "kind": "LocalQueue",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue}}
