"""Per-GPU memory model: parameters, gradients, optimizer state, activations, overheads."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.step import memory
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_testing.layer_builders import layer, t

B = 32


def mlp(batch: int = B) -> ModelGraph:
    layers = (
        layer("fc1", "Gemm", [t("x", batch, 784), t("w1", 784, 256), t("b1", 256)],
              [t("h", batch, 256)], params=["w1", "b1"]),
        layer("relu", "Relu", [t("h", batch, 256)], [t("a", batch, 256)]),
        layer("fc2", "Gemm", [t("a", batch, 256), t("w2", 256, 10), t("b2", 10)],
              [t("y", batch, 10)], params=["w2", "b2"]),
        layer("softmax", "Softmax", [t("y", batch, 10)], [t("p", batch, 10)]),
    )
    return ModelGraph("mlp", layers, (), {"batch": batch}, 17)


P = 784 * 256 + 256 + 256 * 10 + 10


def device(memory_bytes: int) -> DeviceSpec:
    return DeviceSpec(key="test-gpu", name="Test GPU", vendor="nvidia",
                      memory_bytes=memory_bytes, mem_bandwidth_gbps=1000.0,
                      peak_tflops={"fp32": 10.0}, sm_count=10, boost_clock_mhz=1500.0,
                      l2_cache_mb=4.0)


def settings(**kw: Any) -> TrainingSettings:
    return TrainingSettings(**({"batch_size": B} | kw))


@pytest.mark.parametrize(
    ("precision", "optimizer", "params", "grads", "state"),
    [
        ("fp32", "adam", 4, 4, 8),
        ("tf32", "adamw", 4, 4, 8),
        ("fp16", "adam", 6, 2, 8),  # ZeRO's 16 bytes/param for mixed-precision Adam
        ("bf16", "sgd", 6, 2, 0),
        ("fp32", "momentum", 4, 4, 4),
        ("fp32", "rmsprop", 4, 4, 4),
    ],
)
def test_model_state_bytes_per_parameter(
    precision: str, optimizer: str, params: int, grads: int, state: int
) -> None:
    m = memory.training_memory(mlp(), settings(precision=precision, optimizer=optimizer))
    assert (m.parameters_bytes, m.gradients_bytes, m.optimizer_state_bytes) == (
        params * P, grads * P, state * P)


def test_training_keeps_the_tensors_backward_reads_once_each() -> None:
    m = memory.training_memory(mlp(), settings())
    # fc1 keeps x (for dW1); relu keeps its output a, which fc2 also keeps; softmax keeps p.
    assert m.activations_bytes == 4 * B * (784 + 256 + 10)
    half = memory.training_memory(mlp(), settings(precision="bf16"))
    assert half.activations_bytes * 2 == m.activations_bytes


def test_inference_keeps_only_live_peak_and_no_training_state() -> None:
    m = memory.training_memory(mlp(), settings(mode="inference"))
    assert (m.gradients_bytes, m.optimizer_state_bytes, m.parameters_bytes) == (0, 0, 4 * P)
    # Peak at fc1: x and h are alive together.
    assert m.activations_bytes == 4 * B * (784 + 256)


def test_total_and_fits() -> None:
    m = memory.training_memory(mlp(), settings())
    parts = m.as_dict()
    assert parts["total_bytes"] == m.total_bytes == sum(
        v for k, v in parts.items() if k != "total_bytes")
    assert m.framework_overhead_bytes == memory.CUDA_CONTEXT_BYTES
    assert m.workspace_bytes == memory.LIBRARY_WORKSPACE_BYTES + 4 * B * (784 + 256)
    assert m.fits(device(m.total_bytes))
    assert not m.fits(device(m.total_bytes - 1))


def test_data_parallel_splits_batch_proportional_parts() -> None:
    one = memory.training_memory(mlp(), settings())
    four = memory.training_memory(mlp(), settings(), data_parallel=4)
    assert four.per_gpu_batch == 8
    assert four.activations_bytes * 4 == one.activations_bytes
    assert four.parameters_bytes == one.parameters_bytes


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_data_parallel_must_be_positive_int(bad: Any) -> None:
    with pytest.raises(InvalidRequestError) as info:
        memory.training_memory(mlp(), settings(), data_parallel=bad)
    assert info.value.field == "data_parallel"


@hsettings(max_examples=60, deadline=None)
@given(
    batch=st.integers(min_value=1, max_value=4096),
    gpus=st.integers(min_value=1, max_value=64),
    precision=st.sampled_from(["fp32", "fp16", "bf16"]),
    mode=st.sampled_from(["train", "inference"]),
)
def test_more_gpus_never_raise_per_gpu_memory(
    batch: int, gpus: int, precision: str, mode: str
) -> None:
    g = mlp(batch=batch)
    s = settings(batch_size=batch, precision=precision, mode=mode)
    fewer = memory.training_memory(g, s, data_parallel=gpus)
    more = memory.training_memory(g, s, data_parallel=gpus + 1)
    assert more.total_bytes <= fewer.total_bytes
    assert more.per_gpu_batch <= fewer.per_gpu_batch


def test_products_keep_an_operand_only_for_another_operands_gradient() -> None:
    s, b = 4, 2
    layers = (
        layer("q", "MatMul", [t("x", b, s, 8), t("wq", 8, 8)], [t("q", b, s, 8)],
              params=["wq"]),
        layer("scale", "Mul", [t("q", b, s, 8), t("c", 1)], [t("qs", b, s, 8)]),
        layer("mask", "Where", [t("m", 1, s, 8, dtype="bool"), t("qs", b, s, 8), t("inf", 1)],
              [t("masked", b, s, 8)]),
        layer("gelu", "Gelu", [t("masked", b, s, 8)], [t("g", b, s, 8)]),
    )
    g = ModelGraph("products", layers, (), {}, 17)
    m = memory.training_memory(g, settings(batch_size=b))
    # x for dWq (4 B/elt), the scalar c for dq, the bool mask for Where, Gelu's input.
    assert m.activations_bytes == 4 * b * s * 8 + 4 + s * 8 + 4 * b * s * 8
