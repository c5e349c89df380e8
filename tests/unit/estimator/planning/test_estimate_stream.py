"""On two clocks the GPU stream runs kernels only (issue #30): rows timed one eager call at a
time (the shared gpu-ops data) held that call's dispatch, which the host timeline prices, so
the stream keeps none of it; rows `gpuplan bench` timed back to back are the stream's already."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import measurements
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost.predictors import LatencyPrediction
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.latency import learned
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step import host
from gpuplan_estimator.step.decomposition import TrainingSettings

from .test_estimate_host_probes import DEFAULT, UNIT, blocks_graph

KERNEL_MS = 0.05
BENCH_BACKEND = "torch-2.11.0+cu130-cuda"


class RowsOf:
    """Every kernel `KERNEL_MS`, priced by "a bundle model" whose rows came from `backend`."""

    name = "rows"

    def __init__(self, backend: str) -> None:
        self.backend = backend

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        ms = np.full(len(items), KERNEL_MS)
        return LatencyPrediction(ms, ms, ms, ("lightgbm:gemm",) * len(items))

    def backend_name(self, device: DeviceSpec) -> str:
        return self.backend


@pytest.fixture(scope="module")
def h100() -> DeviceSpec:
    return devices.load_catalog().resolve("h100-sxm-80gb")


def kernels_of(estimate: estimates.DeviceStepEstimate) -> float:
    return sum(layer.total_ms for layer in estimate.layers)


def test_eager_call_rows_leave_their_dispatch_to_the_host(h100: DeviceSpec) -> None:
    settings = TrainingSettings(batch_size=4, mode="inference")
    graph = blocks_graph()
    model = host.HostModel(DEFAULT, UNIT)
    eager_rows = RowsOf(measurements.SHARED_OPS_BACKEND)
    (plain,) = estimates.estimate(graph, [h100], settings, predictor=eager_rows)
    (timed,) = estimates.estimate(graph, [h100], settings, predictor=eager_rows,
                                  host_model=model)
    kernels = len(plain.layers)  # one kernel per Gemm and Relu
    assert plain.gpu_busy_ms == pytest.approx(kernels * KERNEL_MS)  # no host: as the rows say
    assert timed.gpu_busy_ms == pytest.approx(
        kernels * (KERNEL_MS - host.EAGER_CALL_DISPATCH_MS))
    assert kernels_of(timed) == pytest.approx(timed.gpu_busy_ms)  # the layers say the same
    assert learned.kernel_timing(eager_rows, h100) == host.EAGER_CALL_TIMING


def test_bench_rows_are_the_streams_already(h100: DeviceSpec) -> None:
    settings = TrainingSettings(batch_size=4, mode="inference")
    bench_rows = RowsOf(BENCH_BACKEND)
    (timed,) = estimates.estimate(blocks_graph(), [h100], settings, predictor=bench_rows,
                                  host_model=host.HostModel(DEFAULT, UNIT))
    assert timed.gpu_busy_ms == pytest.approx(len(timed.layers) * KERNEL_MS)
    assert learned.kernel_timing(bench_rows, h100) == host.STREAM_TIMING
    busy = estimates.stream_busy_ms(blocks_graph(), h100, settings, predictor=bench_rows)
    assert sum(busy) == pytest.approx(timed.gpu_busy_ms)
