"""The host as a second timeline: the two-clock recurrence, the per-item costs, JSON."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np
import pytest

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.step import host, training_ops

PROBE = host.HostProbe(eager_op_us=10.0, module_call_us=30.0, autocast_linear_us=40.0,
                       linear_us=15.0, backward_node_us=8.0,
                       optimizer_foreach_us_per_tensor=2.0,
                       optimizer_for_loop_us_per_tensor=11.0,
                       optimizer_fused_us_per_tensor=0.5, launch_latency_us=5.0,
                       source="test")
UNIT = host.HostCoefficients(forward_kernel=1.0, forward_view=0.5, autocast_cast=1.0,
                             backward_kernel=1.0, autocast_backward=2.0, optimizer_tensor=1.0,
                             log_sigma=0.1)


def naive_end_ms(issued: list[float], gpu: list[float], latency: float) -> list[float]:
    end, out = 0.0, []
    for h, g in zip(issued, gpu, strict=True):
        end = max(h + latency, end) + g
        out.append(end)
    return out


@pytest.mark.parametrize("seed", range(5))
def test_closed_form_matches_the_recurrence(seed: int) -> None:
    rng = np.random.default_rng(seed)
    gpu = rng.exponential(0.05, 300)
    issued = np.cumsum(rng.exponential(0.02, 300))
    np.testing.assert_allclose(host.device_end_ms(issued, gpu, 0.004),
                               naive_end_ms(list(issued), list(gpu), 0.004))


def test_short_kernels_run_at_the_host_and_long_ones_at_the_gpu() -> None:
    phase = np.zeros(100, dtype=np.intp)
    short = host.timeline(np.full(100, 0.001), np.full(100, 20.0), phase, 0.005)
    assert short.device_ms[0] == pytest.approx(2.0 + 0.005 + 0.001)
    assert short.host_bound and short.idle_share > 0.9
    long = host.timeline(np.full(100, 1.0), np.full(100, 20.0), phase, 0.005)
    assert long.device_ms[0] == pytest.approx(100.0 + 0.02 + 0.005)
    assert not long.host_bound


def test_phase_events_read_what_the_stream_drained() -> None:
    # A long forward kernel lets the host issue backward early; backward's event still waits.
    gpu = np.array([5.0, 0.1, 0.1])
    t = host.timeline(gpu, np.array([10.0, 10.0, 10.0]), np.array([0, 1, 2]), 0.0)
    assert t.device_ms == pytest.approx((5.01, 0.1, 0.1))
    assert t.gpu_busy_ms == pytest.approx((5.0, 0.1, 0.1))
    assert t.step_ms == pytest.approx(5.21)


def item(phase: Phase, kernel: str = "elementwise", op: str = "add", role: str = "fwd",
         count: int = 1) -> WorkItem:
    return WorkItem(layer="l", family=OpFamily.ELEMENTWISE, kernel=kernel, phase=phase,
                    dims=MappingProxyType({}), dtype="float32", flops=0, bytes_moved=0, op=op,
                    role=role, count=count)


def test_item_costs_follow_kind_precision_and_count() -> None:
    model = host.HostModel(PROBE, UNIT)
    items = [item(Phase.FORWARD), item(Phase.FORWARD, kernel="none", role="shape_only"),
             item(Phase.FORWARD, kernel="gemm", op="MatMul"),
             item(Phase.FORWARD, kernel="none", role="fused"),
             item(Phase.BACKWARD, count=3), item(Phase.OPTIMIZER), item(Phase.OPTIMIZER)]
    fp32 = model.item_host_us(items, "fp32", parameter_tensors=10, optimizer_impl="foreach")
    np.testing.assert_allclose(fp32, [10.0, 5.0, 10.0, 0.0, 24.0, 10.0, 10.0])
    bf16 = model.item_host_us(items, "bf16", parameter_tensors=10, optimizer_impl="foreach")
    # the MatMul pays autocast's casts (40 - 15 us); backward doubles under autocast
    np.testing.assert_allclose(bf16, [10.0, 5.0, 35.0, 0.0, 48.0, 10.0, 10.0])


def test_a_dropout_or_the_loss_costs_one_module_call_and_one_autograd_node() -> None:
    items = [item(Phase.FORWARD, op="dropout", role=training_ops.ROLE),
             item(Phase.BACKWARD, op="dropout", role=training_ops.ROLE, count=2)]
    for coefficients in (UNIT, dataclasses.replace(UNIT, forward_kernel=7.0,
                                                   backward_kernel=4.0)):
        costs = host.HostModel(PROBE, coefficients).item_host_us(
            items, "bf16", parameter_tensors=0, optimizer_impl="foreach")
        np.testing.assert_allclose(costs, [PROBE.module_call_us, 2 * PROBE.backward_node_us])


def test_without_autograd_the_autocast_term_shrinks_by_its_own_multiplier() -> None:
    items = [item(Phase.FORWARD), item(Phase.FORWARD, kernel="gemm", op="MatMul")]

    def inference_us(coefficients: host.HostCoefficients) -> list[float]:
        return list(host.HostModel(PROBE, coefficients).item_host_us(
            items, "bf16", parameter_tensors=0, optimizer_impl="foreach", training=False))

    apart = dataclasses.replace(UNIT, no_grad_forward=0.5, no_grad_autocast=0.8)
    np.testing.assert_allclose(inference_us(apart), [5.0, 5.0 + 0.8 * 25.0])
    # A bundle made before it holds none: the autocast term takes the ops' multiplier.
    older = dataclasses.replace(UNIT, no_grad_forward=0.5)
    np.testing.assert_allclose(inference_us(older), [5.0, 0.5 * 35.0])
    doc = host.model_to_json(host.HostModel(PROBE, older))
    del doc["coefficients"]["no_grad_autocast"]  # type: ignore[attr-defined]
    assert host.model_from_json(doc).coefficients == older


@pytest.mark.parametrize(("impl", "per_tensor_us"), [
    ("foreach", 2.0), ("fused", 0.5), ("for-loop", 11.0)])
def test_optimizer_host_cost_is_the_probes_figure_for_its_implementation(
        impl: str, per_tensor_us: float) -> None:
    model = host.HostModel(PROBE, UNIT)
    items = [item(Phase.FORWARD), item(Phase.OPTIMIZER), item(Phase.OPTIMIZER)]
    costs = model.item_host_us(items, "fp32", parameter_tensors=10, optimizer_impl=impl)
    assert costs[1:].sum() == pytest.approx(10 * per_tensor_us)


def test_a_probe_without_cuda_has_no_fused_figure_and_says_so() -> None:
    figures = {f.name: 1.0 for f in dataclasses.fields(host.HostProbe)
               if f.name not in ("source", "optimizer_fused_us_per_tensor")}
    probe = host.HostProbe.from_figures(figures, "cpu node")
    assert probe.optimizer_fused_us_per_tensor is None
    assert probe.optimizer_us_per_tensor("for-loop") == 1.0
    with pytest.raises(InvalidRequestError, match="no fused optimizer figure") as info:
        probe.optimizer_us_per_tensor("fused")
    assert info.value.field == "optimizer_impl"
    model = host.HostModel(probe, UNIT)
    assert host.model_from_json(host.model_to_json(model)) == model


def test_an_older_bundles_host_model_still_prices_foreach() -> None:
    # Manifests written before the implementation was priced carry the foreach figure only.
    doc = host.model_to_json(host.HostModel(PROBE, UNIT))
    for name in ("optimizer_for_loop_us_per_tensor", "optimizer_fused_us_per_tensor"):
        del doc["probe"][name]  # type: ignore[attr-defined]
    model = host.model_from_json(doc)
    assert model.probe.optimizer_us_per_tensor("foreach") == 2.0
    with pytest.raises(InvalidRequestError, match="no for-loop optimizer figure"):
        model.probe.optimizer_us_per_tensor("for-loop")


def test_a_folded_constant_costs_the_host_nothing() -> None:
    # An exporter writes a Constant for a value it computed while tracing; eager PyTorch
    # issues nothing for it, unlike a real view (Reshape), which is one dispatch.
    model = host.HostModel(PROBE, UNIT)
    items = [item(Phase.FORWARD, kernel="none", op="Constant", role="shape_only"),
             item(Phase.FORWARD, kernel="none", op="Reshape", role="shape_only")]
    costs = model.item_host_us(items, "fp32", parameter_tensors=0, optimizer_impl="foreach")
    np.testing.assert_allclose(costs, [0.0, 5.0])


def test_json_round_trip_and_errors() -> None:
    model = host.HostModel(PROBE, UNIT)
    assert host.model_from_json(host.model_to_json(model)) == model
    with pytest.raises(ValueError, match="host_model"):
        host.model_from_json({"probe": {}})
    doc = host.model_to_json(model)
    del doc["probe"]["eager_op_us"]  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="eager_op_us"):
        host.model_from_json(doc)


def test_an_autocast_cast_is_issued_inside_the_op_it_feeds() -> None:
    # The dispatcher casts a lowered op's operands on the way in: the host pays the op's
    # autocast term, not a call per cast; the cast's gradient is an autograd node of its own.
    model = host.HostModel(PROBE, UNIT)
    items = [item(Phase.FORWARD, op="cast", role="autocast_cast"),
             item(Phase.FORWARD, kernel="gemm", op="MatMul"),
             item(Phase.BACKWARD, op="cast", role="autocast_cast_grad")]
    costs = model.item_host_us(items, "bf16", parameter_tensors=0, optimizer_impl="foreach")
    np.testing.assert_allclose(costs, [0.0, 35.0, 16.0])


def test_the_stream_keeps_no_dispatch_an_eager_call_timing_held() -> None:
    latency_ms = np.array([0.025, 0.0300, 1.0, 0.001, 0.5])
    learned = np.array([True, True, True, True, False])
    stream = host.on_stream(latency_ms, learned, host.EAGER_CALL_TIMING)
    dispatch = host.EAGER_CALL_DISPATCH_MS
    np.testing.assert_allclose(stream, [host.MIN_KERNEL_MS, 0.03 - dispatch, 1.0 - dispatch,
                                        0.001, 0.5])  # never raised; the roofline's as it is
    np.testing.assert_array_equal(host.on_stream(latency_ms, learned, host.STREAM_TIMING),
                                  latency_ms)
    with pytest.raises(ValueError, match="kernel timing"):
        host.on_stream(latency_ms, learned, "wall")
