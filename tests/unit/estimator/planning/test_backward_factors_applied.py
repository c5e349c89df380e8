"""A GPU's measured backward factors (issue #30): the backward `step.backward` derives for
convolutions, batch norms and pooling is scaled by what that GPU's own forward+backward bench
rows measured (`training.backward_factors`); nothing else, and never on a CPU."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import kernels
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost.predictors import LatencyPrediction
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.graph import examples
from gpuplan_estimator.latency import learned
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step import backward
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step

from .test_estimate_host_probes import blocks_graph

BENCH_BACKEND = "torch-2.11.0+cu130-cuda"
CATALOG = devices.load_catalog()
H200 = CATALOG.resolve("h200-sxm-141gb")
CPU = devices.resolve_device("cpu")


class MeasuredRows:
    """Every kernel 0.05 ms, from a backend whose bench measured `factors` (by group)."""

    name = "rows"

    def __init__(self, factors: Mapping[str, float]) -> None:
        self.bundle = SimpleNamespace(manifest={"backward_factors": {BENCH_BACKEND: factors}},
                                      has_seen=lambda device: True)

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        ms = np.full(len(items), 0.05)
        return LatencyPrediction(ms, ms, ms, ("lightgbm:conv2d",) * len(items))

    def backend_name(self, device: DeviceSpec) -> str:
        return BENCH_BACKEND


@pytest.fixture(scope="module")
def resnet() -> ModelGraph:
    return examples.resnet50(2)


def derived_ms(graph: ModelGraph, kernel: str, settings: TrainingSettings) -> float:
    """The stub's time of the rows `step.backward` derived for `kernel`."""
    step = build_step(graph, settings)
    return sum(0.05 * it.count for it in step.items
               if it.kernel == kernel and it.role in backward.DERIVED_ROLES)


def test_only_the_families_whose_derived_backward_is_corrected_get_a_factor() -> None:
    everything = {f.backward_group: 2.0 for f in kernels.KERNEL_FAMILIES.values()}
    got = learned.backward_factors(MeasuredRows(everything), H200)
    assert got == {"conv2d": 2.0, "pool": 2.0, "batchnorm": 2.0}
    assert learned.backward_factors(MeasuredRows(everything), CPU) == {}
    assert learned.backward_factors(MeasuredRows({"matmul": 0.9}), H200) == {}


def test_a_cnns_derived_convolution_backward_is_scaled_and_nothing_else(
        resnet: ModelGraph) -> None:
    settings = TrainingSettings(batch_size=2, precision="fp32")
    (plain,) = estimates.estimate(resnet, [H200], settings, predictor=MeasuredRows({}))
    (scaled,) = estimates.estimate(resnet, [H200], settings,
                                   predictor=MeasuredRows({"conv": 1.5, "matmul": 3.0}))
    conv_ms = derived_ms(resnet, "conv2d", settings)
    assert conv_ms > 0
    assert scaled.forward_ms == pytest.approx(plain.forward_ms)
    assert scaled.optimizer_ms == pytest.approx(plain.optimizer_ms)
    # matmul's factor is not applied: a GEMM's derived backward is GEMMs at their own shapes
    assert scaled.backward_ms == pytest.approx(plain.backward_ms + 0.5 * conv_ms)
    layers_ms = sum(layer.total_ms for layer in scaled.layers)
    assert layers_ms == pytest.approx(scaled.forward_ms + scaled.backward_ms)
    busy = estimates.stream_busy_ms(resnet, H200, settings,
                                    predictor=MeasuredRows({"conv": 1.5}))
    assert busy[1] == pytest.approx(scaled.backward_ms)


def test_a_graph_without_those_kernels_and_a_cpu_are_unchanged(resnet: ModelGraph) -> None:
    settings = TrainingSettings(batch_size=4, precision="fp32")
    factors: dict[str, Any] = {"conv": 1.5, "batchnorm": 2.0, "pooling": 3.0}
    graph = blocks_graph()
    (plain,) = estimates.estimate(graph, [H200], settings, predictor=MeasuredRows({}))
    (same,) = estimates.estimate(graph, [H200], settings, predictor=MeasuredRows(factors))
    assert same.step_time_ms == pytest.approx(plain.step_time_ms)
    cpu_settings = TrainingSettings(batch_size=2, precision="fp32")
    (cpu_plain,) = estimates.estimate(resnet, [CPU], cpu_settings, predictor=MeasuredRows({}))
    (cpu_same,) = estimates.estimate(resnet, [CPU], cpu_settings,
                                     predictor=MeasuredRows(factors))
    assert cpu_same.backward_ms == pytest.approx(cpu_plain.backward_ms)
