"""A planned job's workload, kept so another model bundle can re-predict it (issue #17).

The promotion gate compares a candidate bundle with the active one on finished TrainingJobs.
An outcome row says how long the job took and what the plan said; to ask a *different* bundle
what it would have said, the estimator keeps what the predictor consumed for the plan's step:
the step's distinct work items (kernel, dims, dtype, op, attributes, FLOPs, bytes) with their
summed counts, at the batch one GPU ran per micro-step, plus the chosen device, GPU count and
training settings. Stored zstd-compressed JSON, keyed by the SHA-256 of its canonical JSON
(`encode`), capped at `core.limits.MAX_WORKLOAD_BYTES`.

Re-prediction (`repredict_seconds`) prices the items with the given predictor exactly as
`planning.estimates` prices a step (median x count, summed), and scales the part of the plan's
step a bundle prices (compute, recompute, pipeline bubble, optimizer) by that bundle's step over
the planning bundle's step on the same items (`reference_step_ms`). Communication parts come
from the scaling model, not the bundle, and are kept. So the planning bundle re-predicts the
planned (uncalibrated) seconds exactly, and another bundle differs only by what it prices.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zstandard

from gpuplan_estimator.core import kernels, limits
from gpuplan_estimator.core.errors import GpuplanError
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost import unrolled
from gpuplan_estimator.cost.predictors import LatencyPredictor, predict_on_each
from gpuplan_estimator.devices.catalog import Catalog, DeviceSpec

SCHEMA_VERSION = 1
ZSTD_LEVEL = 10
BUNDLE_PARTS = ("compute", "recompute", "pp_bubble", "optimizer")
"""Parts of a plan's `step_ms` a latency-model bundle prices; the others (tp_comm, pp_p2p,
dp_comm, offload_copies) come from the scaling model and host link."""


class WorkloadTooLargeError(GpuplanError):
    """The compressed workload is over `limits.MAX_WORKLOAD_BYTES`: it is not stored."""

    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        self.size_bytes = size_bytes
        super().__init__(f"the plan's workload is {size_bytes} bytes compressed, over the "
                         f"{limit_bytes}-byte cap: not stored, so this job cannot score a "
                         f"bundle in the promotion gate")


class InvalidWorkloadError(GpuplanError):
    """Stored bytes that are not a workload of this schema."""


@dataclass(frozen=True)
class Workload:
    """What a plan's chosen candidate ran, as the predictor sees it, and what the plan said."""

    device: str
    """Catalog key of the chosen GPU type."""
    gpu_count: int
    batch_size: int
    """Samples per micro-step on one GPU: the batch the items are at."""
    global_batch: int
    precision: str
    mode: str
    optimizer: str
    steps: int
    """Optimizer steps of the whole job."""
    planned_seconds: float
    """The planning bundle's own (uncalibrated) seconds of the whole job."""
    bundle_share: float
    """Share of the planned step the bundle prices (`BUNDLE_PARTS`), in [0, 1]."""
    reference_step_ms: float
    """The planning bundle's step (ms) on `items`: what `step_ms` gives it back."""
    items: tuple[WorkItem, ...]
    """Distinct work items, `count` summed over identical ones."""
    bundle_version: int | None = None
    """The database bundle that planned it; None for a file bundle."""


def _item_key(item: WorkItem) -> Hashable:
    """`planning.estimates`' key of identical items: it prices the first of them for all (the
    FLOPs and bytes of a dgrad and a forward GEMM of one shape may differ; its price not)."""
    return (item.family, item.kernel, tuple(sorted(item.dims.items())), item.dtype, item.op,
            tuple(sorted(item.attributes.items())))


def distinct_items(items: Sequence[WorkItem]) -> tuple[WorkItem, ...]:
    """Identical items (`_item_key`) merged into the first, counts summed; priced items only
    (kernel "none" costs 0), so the step sums exactly what an estimate of the same step sums."""
    merged: dict[Hashable, WorkItem] = {}
    for item in items:
        if item.kernel == kernels.FREE_KERNEL:
            continue
        key = _item_key(item)
        seen = merged.get(key)
        merged[key] = item if seen is None else dataclasses.replace(
            seen, count=seen.count + item.count)
    return tuple(merged.values())


def bundle_share(plan: Mapping[str, Any]) -> float:
    """Share of a plan candidate's step its bundle prices: from `step_ms` by part when the
    plan has it, else the single-GPU forward+backward+optimizer over the step (a plain
    single-GPU or data-parallel plan, whose remainder is the exposed all-reduce)."""
    parts = plan.get("step_ms")
    if isinstance(parts, Mapping) and parts:
        total = sum(float(v) for v in parts.values())
        priced = sum(float(parts.get(name, 0.0)) for name in BUNDLE_PARTS)
    else:
        total = float(plan["step_time_ms"])
        priced = sum(float(plan.get(k, 0.0)) for k in ("forward_ms", "backward_ms",
                                                       "optimizer_ms"))
    if not total > 0:
        return 1.0
    return min(1.0, max(0.0, priced / total))


def step_ms_many(items_per_workload: Sequence[Sequence[WorkItem]], predictor: LatencyPredictor,
                 device: DeviceSpec) -> list[float]:
    """Each item list's step (ms) on `device`, priced in ONE predictor call: per item the
    median of one execution times its count, summed, as `planning.estimates` sums a step."""
    flat = [item for items in items_per_workload for item in items]
    if not flat:
        return [0.0] * len(items_per_workload)
    median = predict_on_each(predictor, flat, [device])[0].median_ms
    if len(median) != len(flat):
        raise ValueError(f"predictor {predictor.name!r} priced {len(median)} of {len(flat)} "
                         f"items")
    (median,) = unrolled.floored(flat, device, np.asarray(median, dtype=np.float64))
    out, start = [], 0
    for items in items_per_workload:
        stop = start + len(items)
        out.append(float(sum(float(median[i]) * items[i - start].count
                             for i in range(start, stop))))
        start = stop
    return out


def step_ms(items: Sequence[WorkItem], predictor: LatencyPredictor, device: DeviceSpec) -> float:
    """The step (ms) of `items` on `device` by `predictor` (`step_ms_many` of one list)."""
    return step_ms_many([items], predictor, device)[0]


def seconds_from_step(workload: Workload, step_ms_by_bundle: float) -> float:
    """The job's seconds had the plan's bundle-priced share taken `step_ms_by_bundle`."""
    if not workload.reference_step_ms > 0:
        return workload.planned_seconds
    ratio = step_ms_by_bundle / workload.reference_step_ms
    return workload.planned_seconds * (1.0 - workload.bundle_share
                                       + workload.bundle_share * ratio)


def repredict_seconds(workloads: Sequence[Workload], predictor: LatencyPredictor,
                      catalog: Catalog) -> list[float]:
    """Each workload's job seconds by `predictor` (one predictor call per device); the
    planning bundle gives back each `planned_seconds`."""
    by_device: dict[str, list[int]] = {}
    for i, w in enumerate(workloads):
        by_device.setdefault(w.device, []).append(i)
    out = [0.0] * len(workloads)
    for key, indices in by_device.items():
        spec = catalog.resolve(key)
        steps = step_ms_many([workloads[i].items for i in indices], predictor, spec)
        for i, ms in zip(indices, steps, strict=True):
            out[i] = seconds_from_step(workloads[i], ms)
    return out


# -- storage form ------------------------------------------------------------------------------

def _item_json(item: WorkItem) -> dict[str, Any]:
    return {"layer": item.layer, "family": item.family.value, "kernel": item.kernel,
            "phase": item.phase.value, "dims": dict(item.dims), "dtype": item.dtype,
            "flops": item.flops, "bytes_moved": item.bytes_moved, "op": item.op,
            "count": item.count, "role": item.role, "attributes": dict(item.attributes)}


def _item_of(data: Mapping[str, Any]) -> WorkItem:
    return WorkItem(layer=str(data["layer"]), family=OpFamily(data["family"]),
                    kernel=str(data["kernel"]), phase=Phase(data["phase"]),
                    dims={str(k): int(v) for k, v in data["dims"].items()},
                    dtype=str(data["dtype"]), flops=int(data["flops"]),
                    bytes_moved=int(data["bytes_moved"]), op=str(data["op"]),
                    count=int(data["count"]), role=str(data["role"]),
                    attributes=dict(data["attributes"]))


def to_json(w: Workload) -> dict[str, Any]:
    """JSON-ready; `from_json` reads it back."""
    return {"schema_version": SCHEMA_VERSION, "device": w.device, "gpu_count": w.gpu_count,
            "batch_size": w.batch_size, "global_batch": w.global_batch,
            "precision": w.precision, "mode": w.mode, "optimizer": w.optimizer,
            "steps": w.steps, "planned_seconds": w.planned_seconds,
            "bundle_share": w.bundle_share, "reference_step_ms": w.reference_step_ms,
            "bundle_version": w.bundle_version, "items": [_item_json(i) for i in w.items]}


def from_json(data: Mapping[str, Any]) -> Workload:
    """Inverse of `to_json`; `InvalidWorkloadError` for another schema or a missing field."""
    if data.get("schema_version") != SCHEMA_VERSION:
        raise InvalidWorkloadError(f"workload schema {data.get('schema_version')!r}, this "
                                   f"estimator reads {SCHEMA_VERSION}")
    try:
        version = data["bundle_version"]
        return Workload(
            device=str(data["device"]), gpu_count=int(data["gpu_count"]),
            batch_size=int(data["batch_size"]), global_batch=int(data["global_batch"]),
            precision=str(data["precision"]), mode=str(data["mode"]),
            optimizer=str(data["optimizer"]), steps=int(data["steps"]),
            planned_seconds=float(data["planned_seconds"]),
            bundle_share=float(data["bundle_share"]),
            reference_step_ms=float(data["reference_step_ms"]),
            items=tuple(_item_of(i) for i in data["items"]),
            bundle_version=None if version is None else int(version))
    except (KeyError, TypeError, ValueError) as exc:
        raise InvalidWorkloadError(f"workload field missing or bad: {exc}") from exc


def encode(w: Workload, *, limit_bytes: int | None = None) -> tuple[str, bytes]:
    """(id, compressed bytes): the id is the SHA-256 of the canonical JSON, so the same plan
    stored twice is one row. `WorkloadTooLargeError` past `limit_bytes` compressed (None:
    `limits.MAX_WORKLOAD_BYTES`, read at the call)."""
    limit_bytes = limits.MAX_WORKLOAD_BYTES if limit_bytes is None else limit_bytes
    text = json.dumps(to_json(w), sort_keys=True, separators=(",", ":")).encode("utf-8")
    data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(text)
    if len(data) > limit_bytes:
        raise WorkloadTooLargeError(len(data), limit_bytes)
    return hashlib.sha256(text).hexdigest(), data


MAX_DECOMPRESSED_BYTES = 256 * 2**20
"""A stored workload expands to at most this (JSON compresses ~10-50x; the cap is 2 MiB)."""


def decode(data: bytes) -> Workload:
    """Inverse of `encode`; `InvalidWorkloadError` for bytes that are not a workload."""
    try:
        text = zstandard.ZstdDecompressor().decompress(
            data, max_output_size=MAX_DECOMPRESSED_BYTES)
        loaded = json.loads(text)
    except (zstandard.ZstdError, ValueError) as exc:
        raise InvalidWorkloadError(f"not a stored workload: {exc}") from exc
    if not isinstance(loaded, Mapping):
        raise InvalidWorkloadError("not a stored workload: not a JSON object")
    return from_json(loaded)


def planned_seconds(plan: Mapping[str, Any]) -> float:
    """A plan candidate's own (uncalibrated) job seconds: estimated / the calibration factor."""
    factor = float((plan.get("calibration") or {}).get("factor", 1.0))
    seconds = float(plan["estimated_seconds"])
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"calibration factor {factor!r}")
    return seconds / factor
