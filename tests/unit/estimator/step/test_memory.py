"""Per-GPU memory model: the peak of live tensors over a step's schedule, and the fit."""

from __future__ import annotations

import dataclasses
import math
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


def r(n: int) -> int:
    """Bytes the caching allocator charges: 512-byte blocks."""
    return -(-n // 512) * 512


# The MLP's fp32 weights as the allocator holds them, tensor by tensor.
W = r(784 * 256 * 4) + r(256 * 4) + r(256 * 10 * 4) + r(10 * 4)
X = 4 * B * 784  # the input batch, alive through the step


@pytest.mark.parametrize(("optimizer", "state_words", "temporary_words"),
                         [("adamw", 2, 1), ("adam", 2, 1), ("rmsprop", 1, 1),
                          ("adagrad", 1, 1)])
def test_small_batch_peaks_in_the_optimizer_step(optimizer: str, state_words: int,
                                                 temporary_words: int) -> None:
    m = memory.training_memory(mlp(), settings(optimizer=optimizer))
    # Weights, every .grad, the state and the foreach path's sqrt temporary; of the
    # activations only the caller's input batch is left.
    assert m.peak_phase == "optimizer"
    assert (m.parameters_bytes, m.gradients_bytes, m.optimizer_state_bytes,
            m.activations_bytes) == (W, W, W * (state_words + temporary_words), X)


def test_a_fused_update_needs_no_temporary_and_a_for_loop_only_per_tensor_ones() -> None:
    fused = memory.training_memory(mlp(), settings(optimizer_impl="fused"))
    loop = memory.training_memory(mlp(), settings(optimizer_impl="for-loop"))
    assert fused.optimizer_state_bytes == 2 * W  # exp_avg and exp_avg_sq only
    # the for-loop's sqrt and divide temporaries are of the largest tensor, 784 x 256
    assert loop.optimizer_state_bytes == 2 * W + 2 * r(784 * 256 * 4)


def test_backward_frees_saved_tensors_and_allocates_gradients() -> None:
    big = 4096
    m = memory.training_memory(mlp(big), settings(batch_size=big, optimizer="sgd"))
    x, h = 4 * big * 784, 4 * big * 256
    # Peak in relu's backward: x (kept by the caller), relu's saved output a, fc2's gradient
    # da and relu's dh; fc2's weight gradients exist, fc1's not yet.
    assert m.peak_phase == "backward"
    assert m.activations_bytes == x + 3 * h
    assert m.gradients_bytes == r(256 * 10 * 4) + r(10 * 4)
    assert m.parameters_bytes == W


def test_autocast_keeps_fp32_weights_and_adds_half_copies() -> None:
    fp32 = memory.training_memory(mlp(), settings(mode="inference"))
    bf16 = memory.training_memory(mlp(), settings(mode="inference", precision="bf16"))
    assert fp32.parameters_bytes == W
    # fc1's weight and bias are cast to bf16 and cached while the forward runs.
    assert bf16.parameters_bytes >= W + r(784 * 256 * 2) + r(256 * 2)
    assert bf16.parameters_bytes <= W + r(784 * 256 * 2) + r(256 * 2) + r(2560 * 2) + r(20)


def test_inference_frees_a_tensor_after_its_last_reader() -> None:
    m = memory.training_memory(mlp(), settings(mode="inference"))
    assert (m.gradients_bytes, m.optimizer_state_bytes, m.parameters_bytes) == (0, 0, W)
    # Peak at relu: x (the caller's), h and a; h is freed after relu, before fc2.
    assert m.activations_bytes == X + 4 * B * (256 + 256)
    assert m.peak_phase == "inference"


def test_total_is_the_allocated_peak_plus_context_and_reserve() -> None:
    m = memory.training_memory(mlp(), settings())
    parts = m.as_dict()
    assert parts["total_bytes"] == m.total_bytes == sum(
        v for k, v in parts.items() if k != "total_bytes")
    assert m.allocated_peak_bytes == m.total_bytes - m.framework_overhead_bytes
    assert m.framework_overhead_bytes == memory.CUDA_CONTEXT_BYTES + math.ceil(
        memory.ALLOCATOR_RESERVE_FRACTION * m.allocated_peak_bytes)
    assert m.workspace_bytes == memory.LIBRARY_WORKSPACE_BYTES
    assert m.fits(device(m.total_bytes))
    assert not m.fits(device(m.total_bytes - 1))


def test_fit_uses_what_the_card_gives_a_process() -> None:
    m = memory.training_memory(mlp(), settings())
    card = dataclasses.replace(device(m.total_bytes + 2**30),
                               usable_memory_bytes=m.total_bytes - 1)
    assert memory.usable_memory_bytes(card) == m.total_bytes - 1
    assert not m.fits(card)


def test_data_parallel_splits_batch_proportional_parts() -> None:
    one = memory.training_memory(mlp(), settings())
    four = memory.training_memory(mlp(), settings(), data_parallel=4)
    assert four.per_gpu_batch == 8
    assert four.activations_bytes < one.activations_bytes
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
    kept = memory.saved_activation_bytes(g, 4)
    # x for dWq (4 B/elt), the scalar c for dq, the bool mask for Where, Gelu's input.
    assert kept == 4 * b * s * 8 + 4 + s * 8 + 4 * b * s * 8


def dynamo_linear(batch: int = 8, *, select: bool = False) -> ModelGraph:
    """A linear as a dynamo export writes it (MatMul of Transpose(W), then Add(bias)), then
    a row sum, or a select `y[0]` scaled by an input c."""
    layers = [
        layer("wT", "Transpose", [t("W", 64, 32)], [t("wt", 32, 64)]),
        layer("mm", "MatMul", [t("x", batch, 32), t("wt", 32, 64)], [t("p", batch, 64)],
              params=["W"]),
        layer("bias", "Add", [t("p", batch, 64), t("b", 64)], [t("y", batch, 64)],
              params=["b"]),
    ]
    if select:
        layers += [layer("select", "Gather", [t("y", batch, 64), t("i", dtype="int64")],
                         [t("s", 64)]),
                   layer("scale", "Mul", [t("s", 64), t("c", batch, 64)],
                         [t("out", batch, 64)])]
    else:
        layers.append(layer("sum", "ReduceSum", [t("y", batch, 64)], [t("out", batch, 1)]))
    return ModelGraph("dynamo-linear", tuple(layers), (), {"batch": batch}, 17)


WEIGHTS = r(64 * 32 * 4) + r(64 * 4)


def test_a_dynamo_linear_is_one_output() -> None:
    m = memory.training_memory(dynamo_linear(), settings(batch_size=8, mode="inference"))
    # Weights found through the Transpose; the product and the bias sum are one tensor y:
    # the peak is x, y and the row sums, never x, the product and y at once.
    assert m.parameters_bytes == WEIGHTS
    assert m.activations_bytes == 8 * 32 * 4 + 8 * 64 * 4 + r(8 * 4)


def test_a_select_is_a_view_that_keeps_its_base() -> None:
    m = memory.training_memory(dynamo_linear(select=True),
                               settings(batch_size=8, mode="inference"))
    # At the Mul: x, the input c, y (viewed by the select) and the product, all 8 x 64 but x.
    assert m.activations_bytes == 8 * 32 * 4 + 3 * 8 * 64 * 4


def test_a_weight_read_through_a_view_gets_its_gradient_and_state() -> None:
    m = memory.training_memory(dynamo_linear(), settings(batch_size=8, optimizer="adamw"))
    assert m.peak_phase == "optimizer"
    assert (m.parameters_bytes, m.gradients_bytes, m.optimizer_state_bytes) == (
        WEIGHTS, WEIGHTS, 3 * WEIGHTS)
