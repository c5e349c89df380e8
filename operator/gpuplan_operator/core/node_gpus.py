"""Pure: what GPUs a Node offers pods, read from the labels that describe them.

Three labellings are understood:

- GPU Feature Discovery (GFD): `nvidia.com/gpu.product`, `nvidia.com/gpu.count`,
  `nvidia.com/gpu.replicas` (time-slicing or MPS: each GPU is advertised `replicas` times) and
  `nvidia.com/mig.strategy`. With the `single` MIG strategy every GPU is split alike, the
  product label names the profile (`NVIDIA-A100-SXM4-80GB-MIG-1g.10gb`) and `nvidia.com/gpu`
  counts instances; with `mixed` the product label names the parent GPU and each profile is a
  resource of its own (`nvidia.com/mig-1g.10gb`).
- HAMi, whose device plugin registers each GPU split `deviceSplitCount` ways in the node
  annotation `hami.io/node-nvidia-register`.
- GKE without GFD: `cloud.google.com/gke-accelerator` (e.g. `nvidia-l4`), with
  `cloud.google.com/gke-gpu-partition-size` for MIG and
  `cloud.google.com/gke-gpu-sharing-strategy` for time-sharing.

A MIG instance is one device per process, so each is offered one per pod. A shared GPU (time
slices, MPS, HAMi) is never offered: its `nvidia.com/gpu` counts slices of one card, and a plan
of N slices would be priced as N whole GPUs. It is reported as `excluded` instead.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from gpuplan_operator.core import gpu_accounting

GPU_COUNT_LABEL = "nvidia.com/gpu.count"
GPU_REPLICAS_LABEL = "nvidia.com/gpu.replicas"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
HAMI_REGISTER_ANNOTATION = "hami.io/node-nvidia-register"
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"
GKE_PARTITION_LABEL = "cloud.google.com/gke-gpu-partition-size"
GKE_SHARING_LABEL = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_ACCELERATORS: Mapping[str, str] = {
    "nvidia-tesla-p4": "Tesla-P4",
    "nvidia-tesla-t4": "Tesla-T4",
    "nvidia-tesla-p100": "Tesla-P100-PCIE-16GB",
    "nvidia-tesla-v100": "Tesla-V100-SXM2-16GB",
    "nvidia-tesla-a100": "NVIDIA-A100-SXM4-40GB",
    "nvidia-a100-80gb": "NVIDIA-A100-SXM4-80GB",
    "nvidia-l4": "NVIDIA-L4",
    "nvidia-h100-80gb": "NVIDIA-H100-80GB-HBM3",
    "nvidia-h100-mega-80gb": "NVIDIA-H100-80GB-HBM3",
    "nvidia-h200-141gb": "NVIDIA-H200",
    "nvidia-b200": "NVIDIA-B200",
}
"""GKE accelerator label → the GFD product name of the same board (GKE's "GPU platforms" page,
https://cloud.google.com/compute/docs/gpus, read 2026-11-28): what the catalog resolves."""
MIG_PROFILE = re.compile(r"^\d+g\.\d+gb$")
MIG_PRODUCT = re.compile(r"-MIG-(\d+g\.\d+gb)$")


@dataclasses.dataclass(frozen=True)
class GpuOffer:
    """GPUs of one kind on one node, as a plan names them and as a pod asks for them."""

    gpu_type: str
    """The inventory's name: a GFD product, MIG profiles as `<parent>-MIG-<profile>`."""
    resource: str
    """The extended resource a pod requests: `nvidia.com/gpu` or `nvidia.com/mig-<profile>`."""
    node_labels: tuple[tuple[str, str], ...]
    """Labels (all of them) that steer a pod to such a node."""
    allocatable: int
    per_pod: int
    """Most of them one pod can use together: 1 for MIG instances."""


@dataclasses.dataclass(frozen=True)
class NodeGpuOffers:
    """A node's GPU offers, or why its GPUs are left out of plans (`excluded`, else "")."""

    offers: tuple[GpuOffer, ...]
    excluded: str = ""


def _labels(node: Mapping[str, Any]) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _allocatable(node: Mapping[str, Any], resource: str) -> int:
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource)
    if raw is None:
        return 0
    try:
        return gpu_accounting.parse_gpu_quantity(raw)
    except gpu_accounting.QuantityError:
        return 0


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    raw = labels.get(key)
    return int(raw) if isinstance(raw, str) and gpu_accounting.is_decimal(raw) else None


def sharing_of(node: Mapping[str, Any]) -> str:
    """How the node shares each GPU between pods, e.g. "time-slicing x4"; "" when it does not."""
    labels = _labels(node)
    replicas = _int_label(labels, GPU_REPLICAS_LABEL)
    if replicas is not None and replicas > 1:
        count = _int_label(labels, GPU_COUNT_LABEL)
        gpus = f" of {count} GPU(s)" if count is not None else ""
        return f"time-slicing or MPS: {replicas} replicas{gpus} ({GPU_REPLICAS_LABEL})"
    if str(labels.get(gpu_accounting.GPU_PRODUCT_LABEL, "")).endswith("-SHARED"):
        return f"shared GPUs ({gpu_accounting.GPU_PRODUCT_LABEL} ends in -SHARED)"
    if HAMI_REGISTER_ANNOTATION in ((node.get("metadata") or {}).get("annotations") or {}):
        return f"HAMi-shared GPUs ({HAMI_REGISTER_ANNOTATION})"
    if labels.get(GKE_SHARING_LABEL):
        return f"GKE {labels[GKE_SHARING_LABEL]} ({GKE_SHARING_LABEL})"
    return ""


def node_gpus(node: Mapping[str, Any]) -> NodeGpuOffers:
    """The node's GPU offers (none for a node without GPU labels or allocatable GPUs)."""
    sharing = sharing_of(node)
    if sharing:
        return NodeGpuOffers((), excluded=sharing)
    labels = _labels(node)
    product = labels.get(gpu_accounting.GPU_PRODUCT_LABEL)
    if isinstance(product, str) and product:
        return NodeGpuOffers(_gfd_offers(node, product))
    accelerator = labels.get(GKE_ACCELERATOR_LABEL)
    if isinstance(accelerator, str) and accelerator in GKE_ACCELERATORS:
        return NodeGpuOffers(_gke_offers(node, accelerator))
    return NodeGpuOffers(())


def _gfd_offers(node: Mapping[str, Any], product: str) -> tuple[GpuOffer, ...]:
    by_product = ((gpu_accounting.GPU_PRODUCT_LABEL, product),)
    whole = _allocatable(node, gpu_accounting.GPU_RESOURCE)
    offers = []
    if whole:
        # single strategy: the product label already names the profile
        per_pod = 1 if MIG_PRODUCT.search(product) else whole
        offers.append(GpuOffer(product, gpu_accounting.GPU_RESOURCE, by_product, whole, per_pod))
    if _labels(node).get(MIG_STRATEGY_LABEL) == "mixed":
        allocatable = (node.get("status") or {}).get("allocatable") or {}
        for resource in sorted(allocatable):
            profile = resource.removeprefix(MIG_RESOURCE_PREFIX)
            count = _allocatable(node, resource)
            if resource.startswith(MIG_RESOURCE_PREFIX) and MIG_PROFILE.match(profile) and count:
                offers.append(GpuOffer(f"{product}-MIG-{profile}", resource, by_product, count, 1))
    return tuple(offers)


def _gke_offers(node: Mapping[str, Any], accelerator: str) -> tuple[GpuOffer, ...]:
    count = _allocatable(node, gpu_accounting.GPU_RESOURCE)
    if not count:
        return ()
    labels = _labels(node)
    selector: tuple[tuple[str, str], ...] = ((GKE_ACCELERATOR_LABEL, accelerator),)
    partition = labels.get(GKE_PARTITION_LABEL)
    product = GKE_ACCELERATORS[accelerator]
    if isinstance(partition, str) and MIG_PROFILE.match(partition):
        selector += ((GKE_PARTITION_LABEL, partition),)
        return (GpuOffer(f"{product}-MIG-{partition}", gpu_accounting.GPU_RESOURCE, selector,
                         count, 1),)
    return (GpuOffer(product, gpu_accounting.GPU_RESOURCE, selector, count, count),)
