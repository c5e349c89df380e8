"""Order one model's per-device estimates by the user's objective, and recommend one.

The same objectives as a plan (`core.options.OBJECTIVES`) on a single GPU of each type:
cheapest per step, fastest step, or the least cost x time. A device with no known price is
never ranked as free: it sorts after every priced device for cost objectives.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from gpuplan_estimator.core import options
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.planning.estimates import DeviceStepEstimate


@dataclass(frozen=True)
class Recommendation:
    """The device to use under an objective (None when the model fits none) and why."""

    device: DeviceStepEstimate | None
    reason: str


def _step_cost_usd(r: DeviceStepEstimate) -> float | None:
    return r.cost_usd(r.step_time_ms / 1000.0)


def objective_key(r: DeviceStepEstimate, prefer: str) -> tuple[float, ...]:
    """Sort key under `prefer`, lower is better: devices that fit first, priced before
    unpriced for the cost objectives, then the objective, then step time."""
    fits = 0.0 if r.fits else 1.0
    if prefer == "fastest":
        return (fits, r.step_time_ms)
    cost = _step_cost_usd(r)
    if cost is None:
        return (fits, 1.0, math.inf, r.step_time_ms)
    value = cost if prefer == "cheapest" else cost * r.step_time_ms
    return (fits, 0.0, value, r.step_time_ms)


def rank(results: Sequence[DeviceStepEstimate], prefer: str) -> tuple[DeviceStepEstimate, ...]:
    """`results` best first under `prefer` (see `objective_key`)."""
    if prefer not in options.OBJECTIVES:
        raise InvalidRequestError("prefer", f"must be one of {', '.join(options.OBJECTIVES)}, "
                                  f"got {prefer!r}")
    return tuple(sorted(results, key=lambda r: objective_key(r, prefer)))


def recommend(results: Sequence[DeviceStepEstimate], prefer: str) -> Recommendation:
    """The best device under `prefer` among those the model fits, with the reason in words."""
    ranked = rank(results, prefer)
    fitting = [r for r in ranked if r.fits]
    if not fitting:
        return Recommendation(None, f"the model fits none of the {len(results)} devices")
    if prefer == "fastest":
        return Recommendation(fitting[0], f"fastest step of the {len(fitting)} devices the "
                              "model fits")
    priced = [r for r in fitting if r.price_per_hour_usd is not None]
    if not priced:
        return Recommendation(fitting[0], f"fastest of the {len(fitting)} devices the model "
                              f"fits: none has a known price, so {prefer} cannot be judged")
    what = "lowest cost per step" if prefer == "cheapest" else "lowest cost x time"
    return Recommendation(priced[0], f"{what} of the {len(priced)} priced devices the model "
                          "fits")
