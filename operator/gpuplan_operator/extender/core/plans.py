"""Pure: a pod's gpuplan annotations → the GPU type and count it must be placed on.

A pod is *managed* when it carries `gpuplan.io/gpu-type` or `gpuplan.io/gpu-count`; every other
pod passes the extender untouched. The GPUs a pod needs on one node are its own effective
`nvidia.com/gpu` request; the count annotation is used only when the pod requests none, because
a multi-pod job's plan counts GPUs over all its pods.

Reading is total: a managed pod whose plan cannot be read (annotations that are no object, a
container that is `null`, a GPU quantity "²") is a `PlanError` naming the field, which the filter
turns into a rejection of every node; see `plan_for_pod`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import UnknownDeviceError
from gpuplan_operator.core import annotations as plan_keys
from gpuplan_operator.core import gpu_accounting
from gpuplan_operator.extender.core.protocol import type_name as _type_name

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


MAX_TYPE_CHARS = 63
"""A planned type longer than a Kubernetes label value (63 characters) can match no node."""
MAX_GPUS = 1_000_000
"""Upper bound of any GPU number read from a pod: far above any node or job, it only keeps
absurd values (`10**400`) out of int conversions and out of the reasons sent back."""
_MAX_DIGITS = len(str(MAX_GPUS)) + 3  # "1000000000m" still parses before the bound says no


def plan_for_pod(pod: Mapping[str, Any], resolve: TypeResolver) -> PodPlan | None:
    """The pod's plan, None for an unmanaged pod; raises PlanError on anything unreadable.

    Total: whatever the pod dict holds (wrong types, odd digits, huge numbers), the outcome is a
    plan, None, or a PlanError naming the field, never another exception. A pod whose
    annotations cannot be read at all counts as managed, so the filter rejects it (an unreadable
    plan must not schedule unfiltered); an unmanaged pod's spec is not looked at.
    """
    meta = pod.get("metadata")
    if meta is None:
        return None
    if not isinstance(meta, dict):
        raise PlanError("metadata", f"expected an object, got {_type_name(meta)}")
    notes = meta.get("annotations")
    if notes is None:
        return None
    if not isinstance(notes, dict):
        raise PlanError("metadata.annotations", f"expected an object, got {_type_name(notes)}")
    raw_type = notes.get(plan_keys.GPU_TYPE)
    raw_count = notes.get(plan_keys.GPU_COUNT)
    if raw_type is None and raw_count is None:
        return None
    planned_type = _planned_type(raw_type)
    annotated = _planned_count(raw_count)
    requested = _gpu_request(pod)
    gpus = requested if requested > 0 else (annotated or 0)
    return PodPlan(
        planned_type=planned_type,
        accepted_products=None if planned_type is None else _resolve(resolve, planned_type),
        gpus=gpus,
    )


def _resolve(resolve: TypeResolver, planned_type: str) -> frozenset[str]:
    try:
        return resolve(planned_type)
    except Exception as exc:  # an injected resolver must not turn a pod into a server error
        raise PlanError(plan_keys.GPU_TYPE,
                        f"cannot resolve {_show(planned_type)}: {type(exc).__name__}") from exc


def _planned_type(raw: object) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.strip():
        raise PlanError(plan_keys.GPU_TYPE, f"expected a GPU type name, got {_show(raw)}")
    planned = raw.strip()
    if len(planned) > MAX_TYPE_CHARS:
        raise PlanError(plan_keys.GPU_TYPE, f"longer than {MAX_TYPE_CHARS} characters, the "
                        f"longest label value a node can carry: {_show(planned)}")
    return planned


def _planned_count(raw: object) -> int | None:
    if raw is None:
        return None
    digits = raw.strip() if isinstance(raw, str) else ""
    if not gpu_accounting.is_decimal(digits, _MAX_DIGITS):
        raise PlanError(plan_keys.GPU_COUNT, f"expected a positive integer, got {_show(raw)}")
    count = int(digits)
    if not 1 <= count <= MAX_GPUS:
        raise PlanError(plan_keys.GPU_COUNT,
                        f"expected a positive integer up to {MAX_GPUS}, got {_show(raw)}")
    return count


def _gpu_request(pod: Mapping[str, Any]) -> int:
    """The pod's effective GPU request, once every field it is read from has been checked."""
    spec = pod.get("spec")
    if spec is None:
        return 0
    if not isinstance(spec, dict):
        raise PlanError("spec", f"expected an object, got {_type_name(spec)}")
    for key in ("containers", "initContainers"):
        containers = spec.get(key)
        if containers is None:
            continue
        if not isinstance(containers, list):
            raise PlanError(f"spec.{key}", f"expected an array, got {_type_name(containers)}")
        for i, container in enumerate(containers):
            _check_container(container, f"spec.{key}[{i}]")
    overhead = spec.get("overhead")
    if overhead is not None:
        _check_quantities(overhead, "spec.overhead")
    try:
        requested = gpu_accounting.pod_gpu_request(pod)
    except (ValueError, TypeError, AttributeError) as exc:  # not expected after the checks
        raise PlanError("spec", f"unreadable {gpu_accounting.GPU_RESOURCE} request") from exc
    if requested > MAX_GPUS:
        raise PlanError("spec", f"the pod requests {requested} GPUs, more than {MAX_GPUS}")
    return requested


def _check_container(container: object, field: str) -> None:
    if not isinstance(container, dict):
        raise PlanError(field, f"expected an object, got {_type_name(container)}")
    resources = container.get("resources")
    if resources is None:
        return
    if not isinstance(resources, dict):
        raise PlanError(f"{field}.resources", f"expected an object, got {_type_name(resources)}")
    for kind in ("requests", "limits"):
        quantities = resources.get(kind)
        if quantities is not None:
            _check_quantities(quantities, f"{field}.resources.{kind}")


def _check_quantities(quantities: object, field: str) -> None:
    if not isinstance(quantities, dict):
        raise PlanError(field, f"expected an object, got {_type_name(quantities)}")
    raw = quantities.get(gpu_accounting.GPU_RESOURCE)
    if raw is None:
        return
    where = f"{field}[{gpu_accounting.GPU_RESOURCE}]"
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise PlanError(where, f"not a GPU quantity: {_show(raw)}")
    if isinstance(raw, int) and not 0 <= raw <= MAX_GPUS:
        raise PlanError(where, f"expected 0 to {MAX_GPUS} GPUs, got {_show(raw)}")
    text = raw.removesuffix("m") if isinstance(raw, str) else "0"
    if not gpu_accounting.is_decimal(text, _MAX_DIGITS):
        raise PlanError(where, f"not a GPU quantity: {_show(raw)}")
    try:
        value = gpu_accounting.parse_gpu_quantity(raw)
    except ValueError as exc:  # QuantityError: "1500m" is a fractional GPU
        raise PlanError(where, f"fractional GPU quantity: {_show(raw)}") from exc
    if value > MAX_GPUS:
        raise PlanError(where, f"expected 0 to {MAX_GPUS} GPUs, got {_show(raw)}")


def _show(value: object, limit: int = 40) -> str:
    """repr of a user-supplied value, cut to `limit` characters: reasons are sent per node."""
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an int past 4,300 digits, a list nested too deep
        text = f"<{_type_name(value)}>"
    return text if len(text) <= limit else text[: limit - 1] + "…"

