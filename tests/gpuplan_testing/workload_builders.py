"""Real bundles that price GPU softmax work with LightGBM, and plan workloads built from work
items, for the tests of the promotion gate's job-outcome measure (issue #17)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from gpuplan_estimator import devices
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.latency import bundles, selection
from gpuplan_estimator.planning import workloads
from gpuplan_testing.bundle_builders import tiny_bundle


def gpu_bundle(directory: Path, *, seed: int, metrics_seed: int | None = None) -> Path:
    """`tiny_bundle(seed)` whose softmax model prices GPUs (a default GPU backend), with the
    held-out metrics of `tiny_bundle(metrics_seed)` (default: its own) — two bundles that
    predict differently can so tie on every manifest metric."""
    tiny_bundle(directory, seed=seed)
    path = directory / bundles.MANIFEST
    manifest = json.loads(path.read_text())
    manifest["default_backends"] = {"gpu": manifest["backends"][0]}
    if metrics_seed is not None:
        rows = manifest["rows"]
        manifest["metrics"] = {"softmax": {
            "random_split": {"mape_pct": 10.0 + metrics_seed, "rows": rows // 5},
            "random_split_by_device": {d: {"mape_pct": 10.0 + metrics_seed, "rows": rows // 5}
                                       for d in manifest["devices"]}}}
    path.write_text(json.dumps(manifest))
    return directory


def predictor(directory: Path) -> LatencyPredictor:
    """The predictor the service serves from a bundle directory."""
    found, _ = selection.select_predictor(str(directory))
    return found


def softmax_items(shapes: Sequence[tuple[int, int]]) -> tuple[WorkItem, ...]:
    """Forward softmax work items of (rows, cols), fp32, 10 of each."""
    return tuple(WorkItem(layer=f"softmax{i}", family=OpFamily.SOFTMAX, kernel="softmax",
                          phase=Phase.FORWARD, dims={"rows": r, "cols": c}, dtype="float32",
                          flops=5 * r * c, bytes_moved=8 * r * c, op="Softmax", count=10)
                 for i, (r, c) in enumerate(shapes))


def workload(items: Sequence[WorkItem], planned_by: LatencyPredictor, *, device: str = "t4",
             planned_seconds: float = 100.0, bundle_share: float = 1.0) -> workloads.Workload:
    """A single-GPU workload of `items` as `planned_by` planned it."""
    spec = devices.load_catalog().resolve(device)
    return workloads.Workload(
        device=spec.key, gpu_count=1, batch_size=8, global_batch=8, precision="fp32",
        mode="train", optimizer="adamw", steps=1000, planned_seconds=planned_seconds,
        bundle_share=bundle_share,
        reference_step_ms=workloads.step_ms(items, planned_by, spec), items=tuple(items))
