"""A step under autocast prices its dtype-converting kernels at the SMs' unrolled rate
(`cost.unrolled`): in the estimate's layers, and in the stream a profiler would sum."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gpuplan_estimator import devices
from gpuplan_estimator.core.layers import Layer, ModelGraph, OpFamily, TensorInfo
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost import unrolled
from gpuplan_estimator.cost.predictors import LatencyPrediction
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings

TINY_MS = 1e-4
ROWS, COLS = 4096, 1024


class Tiny:
    """Every kernel `TINY_MS`: whatever a step costs beyond that is the floor's."""

    name = "tiny"

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        ms = np.full(len(items), TINY_MS)
        return LatencyPrediction(ms, ms, ms, ("roofline",) * len(items))


def residual() -> ModelGraph:
    """LayerNorm (fp32 out) -> GEMM (bf16 out under autocast) -> residual add of the two."""
    def t(name: str, *shape: int) -> TensorInfo:
        return TensorInfo(name, shape, "float32")

    def layer(name: str, op: str, family: OpFamily, inputs: list[TensorInfo],
              out: TensorInfo, params: tuple[str, ...] = ()) -> Layer:
        return Layer(name, op, family, tuple(inputs), (out,), flops=1, bytes_read=1,
                     bytes_written=1, parameter_count=sum(
                         x.elements for x in inputs if x.name in params),
                     parameter_inputs=params)

    return ModelGraph("residual", (
        layer("ln", "LayerNormalization", OpFamily.NORMALIZATION,
              [t("x", ROWS, COLS), t("g", COLS), t("b", COLS)], t("n", ROWS, COLS), ("g", "b")),
        layer("fc", "MatMul", OpFamily.MATMUL, [t("n", ROWS, COLS), t("w", COLS, COLS)],
              t("h", ROWS, COLS), ("w",)),
        layer("res", "Add", OpFamily.ELEMENTWISE, [t("n", ROWS, COLS), t("h", ROWS, COLS)],
              t("r", ROWS, COLS)),
    ), (), {}, COLS * COLS + 2 * COLS)


def test_the_mixed_residual_add_costs_its_elements_at_the_sms_rate() -> None:
    h200 = devices.resolve_device("h200-sxm-141gb")
    floor_ms = ROWS * COLS / (unrolled.ELEMENTS_PER_SM_CYCLE * h200.sm_count
                              * h200.boost_clock_mhz * 1e3)
    bf16 = TrainingSettings(batch_size=1, mode="inference", precision="bf16")
    (est,) = estimates.estimate(residual(), [h200], bf16, predictor=Tiny())
    by_name = {layer.name: layer.total_ms for layer in est.layers}
    assert np.isclose(by_name["res"], floor_ms)
    # the GEMM and its two operands' casts to bf16, which are vectorised: no floor
    assert np.isclose(by_name["fc"], 3 * TINY_MS)
    forward, _, _ = estimates.stream_busy_ms(residual(), h200, bf16, predictor=Tiny())
    assert forward > floor_ms
    fp32 = TrainingSettings(batch_size=1, mode="inference", precision="fp32")
    (plain,) = estimates.estimate(residual(), [h200], fp32, predictor=Tiny())
    assert {layer.name: layer.total_ms for layer in plain.layers}["res"] == TINY_MS
