"""Max pooling keeps its input and an int64 argmax per output element for backward."""

from __future__ import annotations

from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.step import memory
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_testing.layer_builders import layer, t


def test_max_pool_keeps_input_and_int64_indices() -> None:
    b = 2
    layers = (
        layer("conv", "Conv", [t("x", b, 3, 8, 8), t("w", 4, 3, 3, 3)], [t("c", b, 4, 6, 6)],
              params=["w"], attrs={"kernel_shape": [3, 3]}),
        layer("pool", "MaxPool", [t("c", b, 4, 6, 6)], [t("p", b, 4, 3, 3)],
              attrs={"kernel_shape": [2, 2], "strides": [2, 2]}),
    )
    g = ModelGraph("pool", layers, (), {"batch": b}, 17)
    for precision, width in (("fp32", 4), ("bf16", 2)):
        m = memory.training_memory(g, TrainingSettings(batch_size=b, precision=precision))
        # conv keeps x (for dW); the pool keeps c and the argmax of each of its outputs.
        assert m.saved_activations_bytes == width * b * (3 * 8 * 8 + 4 * 6 * 6) + 8 * b * 4 * 3 * 3
