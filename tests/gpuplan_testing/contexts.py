"""Planner contexts for service tests, importable by name so the estimation worker processes
(forkserver children) can build them: a loader crosses to a worker by pickle."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuplan_estimator import devices
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.cost.predictors import LatencyPrediction
from gpuplan_estimator.devices import DeviceSpec
from gpuplan_estimator.planning import planner


def roofline_context(source: str = "roofline") -> planner.PlannerContext:
    """The catalog with the roofline predictor: fast, no bundle to load. `source` names it as
    the service's bundle version."""
    return planner.PlannerContext(
        catalog=devices.load_catalog(), predictor=roofline.RooflinePredictor(),
        predictor_source=source,
    )


def roofline_named_by_file(path: str) -> planner.PlannerContext:
    """A roofline context named by the text of `path`: rewrite the file to "publish a new
    bundle" that the service and its workers each pick up on their next load."""
    return roofline_context(Path(path).read_text().strip())


@dataclass(frozen=True)
class SlowOnDevice:
    """Roofline, except that predicting for `device_key` first records this process's pid in
    `pid_dir` and sleeps `seconds`: an estimate that outlives its deadline, on demand."""

    device_key: str
    seconds: float
    pid_dir: str
    name: str = "slow-roofline"

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        if device.key == self.device_key:
            (Path(self.pid_dir) / str(os.getpid())).touch()
            time.sleep(self.seconds)
        return roofline.RooflinePredictor().predict(items, device)


def slow_context(device_key: str, seconds: float, pid_dir: str) -> planner.PlannerContext:
    """The catalog with `SlowOnDevice`."""
    return planner.PlannerContext(
        catalog=devices.load_catalog(), predictor=SlowOnDevice(device_key, seconds, pid_dir),
        predictor_source="slow-roofline",
    )


@dataclass(frozen=True)
class HungryOnDevice:
    """Roofline, except that predicting for `device_key` first allocates `allocate_bytes`."""

    device_key: str
    allocate_bytes: int
    name: str = "hungry-roofline"

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        if device.key == self.device_key:
            hoard = bytearray(self.allocate_bytes)
            del hoard
        return roofline.RooflinePredictor().predict(items, device)


def hungry_context(device_key: str, allocate_bytes: int) -> planner.PlannerContext:
    """The catalog with `HungryOnDevice`."""
    return planner.PlannerContext(
        catalog=devices.load_catalog(), predictor=HungryOnDevice(device_key, allocate_bytes),
        predictor_source="hungry-roofline",
    )


GATE_POLL_S = 0.05


def gated_context(gate_file: str) -> planner.PlannerContext:
    """The roofline context, built only once `gate_file` exists: a bundle whose load takes as
    long as a test wants (a real one takes seconds)."""
    while not Path(gate_file).exists():
        time.sleep(GATE_POLL_S)
    return roofline_context()
