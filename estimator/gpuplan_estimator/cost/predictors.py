"""The predictor seam: anything that prices work items on a device.

`roofline.RooflinePredictor` is the always-available baseline; learned LightGBM models
(`latency`) implement the same protocol and fall back to the roofline per uncovered family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.devices.catalog import DeviceSpec

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class LatencyPrediction:
    """Per-work-item latency of ONE execution (multiply by `WorkItem.count` to total)."""

    median_ms: FloatArray
    p10_ms: FloatArray  # equals median_ms when the predictor has no interval
    p90_ms: FloatArray
    predictor: tuple[str, ...]  # which predictor priced each item, e.g. "lightgbm:gemm", "roofline"


class LatencyPredictor(Protocol):
    """Anything that prices work items on a device (roofline, learned, scaled, ...)."""

    name: str

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        """Median, P10 and P90 ms per item on `device`, and which predictor priced each."""
        ...


@runtime_checkable
class PredictsMany(Protocol):
    """A predictor that prices items on several devices at once, cheaper than one by one."""

    def predict_many(self, items: Sequence[WorkItem], devices: Sequence[DeviceSpec]
                     ) -> list[LatencyPrediction]:
        """`predict` on each device, in order."""
        ...


def predict_on_each(predictor: LatencyPredictor, items: Sequence[WorkItem],
                    devices: Sequence[DeviceSpec]) -> list[LatencyPrediction]:
    """`predictor.predict` on each device, batched when the predictor can batch."""
    if isinstance(predictor, PredictsMany):
        return predictor.predict_many(items, devices)
    return [predictor.predict(items, device) for device in devices]
