"""Pure reading of the plan and estimate JSON documents into the values the pictures draw.

Keys are read by name, so fields added to the documents are ignored; a needed key that is
missing or not a number raises `InvalidRequestError` naming its path in the document.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator.core import vocabulary
from gpuplan_estimator.core.errors import InvalidRequestError

SECONDS_PER_HOUR = 3600.0
# Memory parts of `docs/estimate-json.md` in drawing order, each with its legend label.
MEMORY_PARTS = tuple((part, part.removesuffix("_bytes").replace("_", " "))
                     for part in vocabulary.MEMORY_PARTS)
OTHER_MEMORY = "other"  # total_bytes beyond the known parts (a part added to the document later)
WIDE_SPREAD_RATIO = 10.0  # max/min at which an axis turns logarithmic


@dataclass(frozen=True)
class PlanPoint:
    """One plan candidate as drawn: GPU type and count, hours to train, cost or None."""

    gpu_type: str
    gpu_count: int
    nodes: int
    hours: float
    hours_p10: float
    hours_p90: float
    cost_usd: float | None  # None: the GPU type has no known price (never drawn at $0)
    chosen: bool


@dataclass(frozen=True)
class PlanLimits:
    """The request's deadline and budget, when it had them."""

    deadline_hours: float | None
    budget_usd: float | None


@dataclass(frozen=True)
class DeviceRow:
    """One device of an estimate: step phases and interval (ms), memory parts vs capacity."""

    device: str
    phases_ms: tuple[tuple[str, float], ...]  # (forward|backward|optimizer, ms)
    step_time_ms: float
    p10_ms: float
    p90_ms: float
    memory_parts_bytes: tuple[tuple[str, int], ...]  # (label, bytes), total_bytes in all
    memory_total_bytes: int
    memory_available_bytes: int
    fits: bool


def pareto_front(points: Sequence[tuple[float, float]]) -> tuple[int, ...]:
    """Indices of the (time, cost) points no other point beats: none is at least as fast and
    as cheap and strictly better in one. Ordered fastest first; identical points are all kept
    (neither beats the other). Values must be finite."""
    front: list[int] = []
    cheapest = math.inf
    for i in sorted(range(len(points)), key=lambda i: points[i]):
        if points[i][1] < cheapest or (front and points[front[-1]] == points[i]):
            front.append(i)
            cheapest = min(cheapest, points[i][1])
    return tuple(front)


def wide_spread(values: Sequence[float]) -> bool:
    """Whether positive `values` span a factor of WIDE_SPREAD_RATIO or more (log axis)."""
    positive = [v for v in values if v > 0]
    return len(positive) == len(values) > 1 and max(positive) / min(positive) >= WIDE_SPREAD_RATIO


def _get(doc: Mapping[str, Any], key: str, path: str) -> Any:
    if not isinstance(doc, Mapping):
        raise InvalidRequestError(path, "must be a JSON object")
    if key not in doc:
        raise InvalidRequestError(f"{path}.{key}" if path else key, "missing from the document")
    return doc[key]


def _number(doc: Mapping[str, Any], key: str, path: str) -> float:
    value = _get(doc, key, path)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidRequestError(f"{path}.{key}", f"must be a finite number, got {value!r}")
    return float(value)


def _count(doc: Mapping[str, Any], key: str, path: str) -> int:
    value = _number(doc, key, path)
    if not value.is_integer():
        raise InvalidRequestError(f"{path}.{key}", f"must be a whole number, got {value!r}")
    return int(value)


def known_cost_usd(candidate: Mapping[str, Any]) -> float | None:
    """The candidate's cost, or None when its price is unknown: cost null, absent or NaN, a
    `price_known: false` flag, or a cost of 0 — the planner prices a GPU without a known price
    (catalog price 0.0, "no known price, never free") at $0, and no real plan costs nothing."""
    cost = candidate.get("cost_usd")
    if candidate.get("price_known") is False or isinstance(cost, bool):
        return None
    if not isinstance(cost, int | float) or not math.isfinite(cost) or cost <= 0:
        return None
    return float(cost)


def _same_plan(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    keys = ("gpu_type", "gpu_count", "nodes")
    return all(a.get(k) == b.get(k) for k in keys)


def _plan_point(c: Mapping[str, Any], path: str, chosen: bool) -> PlanPoint:
    seconds = _number(c, "estimated_seconds", path)
    interval = c.get("interval_seconds")
    lo, hi = (interval if isinstance(interval, Sequence) and len(interval) == 2
              else (seconds, seconds))
    return PlanPoint(
        gpu_type=str(_get(c, "gpu_type", path)), gpu_count=_count(c, "gpu_count", path),
        nodes=_count(c, "nodes", path), hours=seconds / SECONDS_PER_HOUR,
        hours_p10=float(lo) / SECONDS_PER_HOUR, hours_p90=float(hi) / SECONDS_PER_HOUR,
        cost_usd=known_cost_usd(c), chosen=chosen,
    )


def plan_points(plan_doc: Mapping[str, Any]) -> tuple[PlanPoint, ...]:
    """Every candidate of a plan document (the chosen plan marked, added if not listed)."""
    candidates = _get(plan_doc, "candidates", "")
    chosen = _get(plan_doc, "plan", "")
    if not isinstance(candidates, list) or not candidates:
        raise InvalidRequestError("candidates", "the plan document has no candidates to draw")
    points = [_plan_point(c, f"candidates[{i}]", chosen is not None and _same_plan(c, chosen))
              for i, c in enumerate(candidates)]
    if chosen is not None and not any(p.chosen for p in points):
        points.append(_plan_point(chosen, "plan", True))
    return tuple(points)


def _positive_or_none(value: Any, path: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidRequestError(path, f"must be a positive number, got {value!r}")
    return float(value)


def plan_limits(plan_doc: Mapping[str, Any], *, deadline_seconds: float | None = None,
                budget_usd: float | None = None) -> PlanLimits:
    """Deadline and budget: the arguments when given, else the document's `objective` (the
    request's, where a plan document carries it), else none."""
    objective = plan_doc.get("objective")
    objective = objective if isinstance(objective, Mapping) else {}
    deadline = (deadline_seconds if deadline_seconds is not None
                else objective.get("deadline_seconds"))
    budget = budget_usd if budget_usd is not None else objective.get("budget_usd")
    deadline_s = _positive_or_none(deadline, "objective.deadline_seconds")
    return PlanLimits(
        deadline_hours=None if deadline_s is None else deadline_s / SECONDS_PER_HOUR,
        budget_usd=_positive_or_none(budget, "objective.budget_usd"),
    )


def _memory_parts(memory: Mapping[str, Any], path: str) -> tuple[tuple[str, int], ...]:
    parts = [(label, _count(memory, key, path)) for key, label in MEMORY_PARTS]
    rest = _count(memory, "total_bytes", path) - sum(b for _, b in parts)
    if rest > 0:
        parts.append((OTHER_MEMORY, rest))
    return tuple(parts)


def _device_row(d: Mapping[str, Any], path: str) -> DeviceRow:
    interval = _get(d, "interval_ms", path)
    memory = _get(d, "memory", path)
    return DeviceRow(
        device=str(_get(d, "device", path)),
        phases_ms=tuple((phase, _number(d, f"{phase}_ms", path))
                        for phase in ("forward", "backward", "optimizer")),
        step_time_ms=_number(d, "step_time_ms", path),
        p10_ms=_number(interval, "p10", f"{path}.interval_ms"),
        p90_ms=_number(interval, "p90", f"{path}.interval_ms"),
        memory_parts_bytes=_memory_parts(memory, f"{path}.memory"),
        memory_total_bytes=_count(memory, "total_bytes", f"{path}.memory"),
        memory_available_bytes=_count(d, "memory_available_bytes", path),
        fits=bool(_get(d, "fits", path)),
    )


def device_rows(estimate_doc: Mapping[str, Any]) -> tuple[DeviceRow, ...]:
    """Every device of an estimate document, fastest step first (ties by name)."""
    devices = _get(estimate_doc, "devices", "")
    if not isinstance(devices, list) or not devices:
        raise InvalidRequestError("devices", "the estimate document has no devices to draw")
    rows = [_device_row(d, f"devices[{i}]") for i, d in enumerate(devices)]
    return tuple(sorted(rows, key=lambda r: (r.step_time_ms, r.device)))


def estimate_title(estimate_doc: Mapping[str, Any]) -> str:
    """`model: mode, batch N, precision` from whichever of those the document has."""
    model = estimate_doc.get("model")
    settings = estimate_doc.get("settings")
    name = model.get("name") if isinstance(model, Mapping) else None
    words = []
    if isinstance(settings, Mapping):
        words = [str(settings[k]) if k != "batch_size" else f"batch {settings[k]}"
                 for k in ("mode", "batch_size", "precision") if settings.get(k) is not None]
    return f"{name or 'model'}: {', '.join(words)}" if words else str(name or "estimate")
