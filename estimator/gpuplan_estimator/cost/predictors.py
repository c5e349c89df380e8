"""The predictor seam: anything that prices work items on a device.

`roofline.RooflinePredictor` is the always-available baseline; learned LightGBM models
(`latency`) implement the same protocol and fall back to the roofline per uncovered family.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

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
