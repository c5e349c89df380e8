"""gpuplan's estimator: predict step time, epoch time and memory of DL training per GPU type.

The public API, re-exported lazily (PEP 562) so that importing one submodule does not pay for
onnx, LightGBM and the rest. ``estimate`` is the submodule (its function is
``estimate.estimate``): a package attribute cannot be both once the submodule is imported::

    from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, load_catalog
    from gpuplan_estimator import load_model
    g = load_model("model.onnx", batch=32)
    results = estimate.estimate(g, load_catalog().devices, TrainingSettings(batch_size=32),
                                predictor=RooflinePredictor())
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS: dict[str, str] = {
    "to_json": "gpuplan_estimator.estimate",
    "DeviceEstimate": "gpuplan_estimator.estimate",
    "LayerEstimate": "gpuplan_estimator.estimate",
    "TrainingSettings": "gpuplan_estimator.training_step",
    "StepWork": "gpuplan_estimator.training_step",
    "build_step": "gpuplan_estimator.training_step",
    "MemoryBreakdown": "gpuplan_estimator.memory",
    "training_memory": "gpuplan_estimator.memory",
    "load_model": "gpuplan_estimator.graph",
    "strip_weights": "gpuplan_estimator.graph",
    "ModelGraph": "gpuplan_estimator.layers",
    "Layer": "gpuplan_estimator.layers",
    "DeviceSpec": "gpuplan_estimator.devices",
    "load_catalog": "gpuplan_estimator.devices",
    "resolve_device": "gpuplan_estimator.devices",
    "LatencyPrediction": "gpuplan_estimator.predictors",
    "LatencyPredictor": "gpuplan_estimator.predictors",
    "RooflinePredictor": "gpuplan_estimator.roofline",
    "WorkItem": "gpuplan_estimator.workload",
    "GpuplanError": "gpuplan_estimator.errors",
}
__all__ = [
    "DeviceEstimate",
    "DeviceSpec",
    "GpuplanError",
    "LatencyPrediction",
    "LatencyPredictor",
    "Layer",
    "LayerEstimate",
    "MemoryBreakdown",
    "ModelGraph",
    "RooflinePredictor",
    "StepWork",
    "TrainingSettings",
    "WorkItem",
    "build_step",
    "estimate",
    "load_catalog",
    "load_model",
    "resolve_device",
    "strip_weights",
    "to_json",
    "training_memory",
]

if TYPE_CHECKING:
    from gpuplan_estimator.devices import DeviceSpec, load_catalog, resolve_device
    from gpuplan_estimator.errors import GpuplanError
    from gpuplan_estimator.estimate import DeviceEstimate, LayerEstimate, to_json
    from gpuplan_estimator.graph import load_model, strip_weights
    from gpuplan_estimator.layers import Layer, ModelGraph
    from gpuplan_estimator.memory import MemoryBreakdown, training_memory
    from gpuplan_estimator.predictors import LatencyPrediction, LatencyPredictor
    from gpuplan_estimator.roofline import RooflinePredictor
    from gpuplan_estimator.training_step import StepWork, TrainingSettings, build_step
    from gpuplan_estimator.workload import WorkItem


def __getattr__(name: str) -> Any:
    if name == "estimate":
        return importlib.import_module("gpuplan_estimator.estimate")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gpuplan_estimator' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
