"""Pure GPU accounting of pods and nodes, shared by the operator and the scheduler extender.

A pod's GPUs are counted as the scheduler and the kubelet count them (KEP-753 sidecars): the
larger of the app containers plus the restartable ("sidecar") init containers, and of each plain
init container plus the sidecars started before it; the pod's `overhead` is added on top.
Extended resources cannot be overcommitted, so a request defaults to the limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
"""Pod phases whose containers no longer hold their resources."""
ACTIVE_PODS_FIELD_SELECTOR = ",".join(f"status.phase!={phase}" for phase in sorted(TERMINAL_PHASES))
"""Field selector of the pods that may hold GPUs: what the operator and the extender list."""


class QuantityError(ValueError):
    """A GPU quantity is not a non-negative integer (extended resources cannot be fractional)."""


MAX_QUANTITY_DIGITS = 12


def is_decimal(text: str, max_digits: int = MAX_QUANTITY_DIGITS) -> bool:
    """1 to `max_digits` ASCII digits: `str.isdigit` also accepts "²" (int() fails) and "٣"
    (int() reads 3), and int() of a string past 4,300 digits raises."""
    return 0 < len(text) <= max_digits and text.isascii() and text.isdigit()


def parse_gpu_quantity(raw: object) -> int:
    """An extended-resource quantity: "8", 8, or "8000m" are 8; anything fractional is an error."""
    if isinstance(raw, bool):
        raise QuantityError(f"not a GPU quantity: {raw!r}")
    if isinstance(raw, int):
        value = raw
    elif isinstance(raw, str) and is_decimal(raw):
        value = int(raw)
    elif isinstance(raw, str) and raw.endswith("m") and is_decimal(raw[:-1]):
        milli = int(raw[:-1])
        if milli % 1000:
            raise QuantityError(f"fractional GPU quantity: {raw!r}")
        value = milli // 1000
    else:
        raise QuantityError(f"not a GPU quantity: {raw!r}")
    if value < 0:
        raise QuantityError(f"negative GPU quantity: {raw!r}")
    return value


def container_gpus(container: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    """GPUs one container asks for: its request, else its limit (they must be equal if both);
    `resource` is `nvidia.com/gpu` or a MIG profile's (`nvidia.com/mig-1g.10gb`)."""
    resources = container.get("resources") or {}
    requests = resources.get("requests") or {}
    limits = resources.get("limits") or {}
    raw = requests.get(resource, limits.get(resource))
    return 0 if raw is None else parse_gpu_quantity(raw)


def pod_gpu_request(pod: Mapping[str, Any], resource: str = GPU_RESOURCE) -> int:
    """Effective GPU request of a pod (see the module docstring); raises QuantityError."""
    spec = pod.get("spec") or {}
    app = sum(container_gpus(c, resource) for c in spec.get("containers") or ())
    sidecars = 0
    init_peak = 0
    for c in spec.get("initContainers") or ():
        if c.get("restartPolicy") == "Always":
            sidecars += container_gpus(c, resource)
        else:
            init_peak = max(init_peak, sidecars + container_gpus(c, resource))
    overhead = (spec.get("overhead") or {}).get(resource)
    extra = 0 if overhead is None else parse_gpu_quantity(overhead)
    return max(app + sidecars, init_peak) + extra


def holds_gpus_on(pod: Mapping[str, Any]) -> str | None:
    """The node a pod is bound to while it still holds its resources (not terminal), else None."""
    node_name = (pod.get("spec") or {}).get("nodeName")
    phase = (pod.get("status") or {}).get("phase")
    if not node_name or phase in TERMINAL_PHASES:
        return None
    return str(node_name)


def held_gpus(pod: Mapping[str, Any], resource: str = GPU_RESOURCE) -> tuple[str, int] | None:
    """(node, GPUs) a bound, live pod holds; None when it holds none or its quantity is
    malformed (which cannot have passed apiserver validation, so it counts as zero)."""
    node_name = holds_gpus_on(pod)
    if node_name is None:
        return None
    try:
        gpus = pod_gpu_request(pod, resource)
    except QuantityError:
        return None
    return (node_name, gpus) if gpus > 0 else None


def node_allocatable_gpus(node: Mapping[str, Any]) -> int | None:
    """A node's allocatable GPUs; None when absent or malformed."""
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)
    if raw is None:
        return None
    try:
        return parse_gpu_quantity(raw)
    except QuantityError:
        return None


def node_product(node: Mapping[str, Any]) -> str | None:
    """A node's GPU type (the GPU Feature Discovery product label), None when unlabelled."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    product = labels.get(GPU_PRODUCT_LABEL)
    return product if isinstance(product, str) and product else None
