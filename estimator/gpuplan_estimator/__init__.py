"""gpuplan's estimator: predict step time, epoch time and memory of DL training per GPU type.

The public API, re-exported lazily (PEP 562) so that importing one submodule does not pay for
onnx, LightGBM and the rest::

    from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, load_catalog
    from gpuplan_estimator import load_model
    g = load_model("model.onnx", batch=32)
    results = estimate(g, load_catalog().devices, TrainingSettings(batch_size=32),
                       predictor=RooflinePredictor())

The package's subpackages follow the data flow, each importing only those before it (checked
by `lint-imports`, see `.importlinter`): `core` → `devices` → `graph` → `step` | `cost` →
`latency` → `perfdb` → `planning` → `bench` → `training` → `evaluation`; at the edge
`interfaces` (the CLI and the HTTP service, and the JSON documents they answer with), which
nothing imports. Planning never opens the database: the edges read it and hand in the data.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuplan_estimator.core.lazy_exports import lazy_exports

_EXPORTS: dict[str, str] = {
    "estimate": "gpuplan_estimator.planning.estimates",
    "to_json": "gpuplan_estimator.interfaces.json_documents",
    "DeviceStepEstimate": "gpuplan_estimator.planning.estimates",
    "LayerTimeEstimate": "gpuplan_estimator.planning.estimates",
    "TrainingSettings": "gpuplan_estimator.step.decomposition",
    "StepWork": "gpuplan_estimator.step.decomposition",
    "build_step": "gpuplan_estimator.step.decomposition",
    "MemoryBreakdown": "gpuplan_estimator.step.memory",
    "training_memory": "gpuplan_estimator.step.memory",
    "load_model": "gpuplan_estimator.graph.loading",
    "strip_weights": "gpuplan_estimator.graph.loading",
    "ModelGraph": "gpuplan_estimator.core.layers",
    "Layer": "gpuplan_estimator.core.layers",
    "DeviceSpec": "gpuplan_estimator.devices.catalog",
    "load_catalog": "gpuplan_estimator.devices.catalog",
    "resolve_device": "gpuplan_estimator.devices.resolution",
    "LatencyPrediction": "gpuplan_estimator.cost.predictors",
    "LatencyPredictor": "gpuplan_estimator.cost.predictors",
    "RooflinePredictor": "gpuplan_estimator.cost.roofline",
    "WorkItem": "gpuplan_estimator.core.workload",
    "GpuplanError": "gpuplan_estimator.core.errors",
}
__all__ = [
    "DeviceSpec",
    "DeviceStepEstimate",
    "GpuplanError",
    "LatencyPrediction",
    "LatencyPredictor",
    "Layer",
    "LayerTimeEstimate",
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
    from gpuplan_estimator.core.errors import GpuplanError
    from gpuplan_estimator.core.layers import Layer, ModelGraph
    from gpuplan_estimator.core.workload import WorkItem
    from gpuplan_estimator.cost.predictors import LatencyPrediction, LatencyPredictor
    from gpuplan_estimator.cost.roofline import RooflinePredictor
    from gpuplan_estimator.devices.catalog import DeviceSpec, load_catalog
    from gpuplan_estimator.devices.resolution import resolve_device
    from gpuplan_estimator.graph.loading import load_model, strip_weights
    from gpuplan_estimator.interfaces.json_documents import to_json
    from gpuplan_estimator.planning.estimates import DeviceStepEstimate, LayerTimeEstimate, estimate
    from gpuplan_estimator.step.decomposition import StepWork, TrainingSettings, build_step
    from gpuplan_estimator.step.memory import MemoryBreakdown, training_memory


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, lambda: list(globals()))
