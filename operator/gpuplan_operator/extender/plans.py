"""Pure: a pod's gpuplan annotations → the GPU type and count it must be placed on.

A pod is *managed* when it carries `gpuplan.io/gpu-type` or `gpuplan.io/gpu-count`; every other
pod passes the extender untouched. The GPUs a pod needs on one node are its own effective
`nvidia.com/gpu` request; the count annotation is used only when the pod requests none, because
a multi-pod job's plan counts GPUs over all its pods.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import UnknownDeviceError
from gpuplan_operator import annotations as plan_keys
from gpuplan_operator import gpu_accounting

TypeResolver = Callable[[str], frozenset[str]]
"""Planned type as written → the accepted `nvidia.com/gpu.product` values, casefolded."""


class PlanError(ValueError):
    """A plan annotation is malformed; `field` names the annotation."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


@dataclass(frozen=True)
class PodPlan:
    """Where a managed pod may go: `accepted_products` is None when any GPU type will do."""

    planned_type: str | None
    accepted_products: frozenset[str] | None
    gpus: int


def resolve_gfd_only(planned: str) -> frozenset[str]:
    """Without a device catalog, the planned type must be the GFD product value itself."""
    return frozenset({planned.casefold()})


# GFD appends this to gpu.product when time-slicing/MPS sharing is on; the device is the same.
_SHARED_SUFFIX = "-shared"


def catalog_resolver(catalog: devices.Catalog) -> TypeResolver:
    """A TypeResolver mapping a planned GPU type to the GFD products a node may carry for it.

    Any name the device catalog resolves (key, NVML name, GFD label, alias) is accepted: the node
    passes with any of that device's GFD products (plus their `-SHARED` forms). A name the
    catalog does not know must equal the node's label.
    """

    @functools.lru_cache(maxsize=256)  # bounded: the planned type is user input
    def resolve(planned: str) -> frozenset[str]:
        try:
            spec = catalog.resolve(planned)
        except UnknownDeviceError:
            return resolve_gfd_only(planned)
        products = {p.casefold() for p in spec.gfd_products} | {planned.casefold()}
        return frozenset(products | {p + _SHARED_SUFFIX for p in products})

    return resolve


def plan_for_pod(pod: Mapping[str, Any], resolve: TypeResolver) -> PodPlan | None:
    """The pod's plan, None for an unmanaged pod; raises PlanError on malformed annotations."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    raw_type = notes.get(plan_keys.GPU_TYPE)
    raw_count = notes.get(plan_keys.GPU_COUNT)
    if raw_type is None and raw_count is None:
        return None
    planned_type = _planned_type(raw_type)
    try:
        requested = gpu_accounting.pod_gpu_request(pod)
    except gpu_accounting.QuantityError as exc:
        raise PlanError(
            f"spec.containers[].resources[{gpu_accounting.GPU_RESOURCE}]", str(exc)) from exc
    annotated = _planned_count(raw_count)
    gpus = requested if requested > 0 else (annotated or 0)
    return PodPlan(
        planned_type=planned_type,
        accepted_products=None if planned_type is None else resolve(planned_type),
        gpus=gpus,
    )


def _planned_type(raw: object) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise PlanError(plan_keys.GPU_TYPE, f"expected a GPU type name, got {raw!r}")
    return raw.strip()


def _planned_count(raw: object) -> int | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip().isdigit() or int(raw) < 1:
        raise PlanError(plan_keys.GPU_COUNT, f"expected a positive integer, got {raw!r}")
    return int(raw)
