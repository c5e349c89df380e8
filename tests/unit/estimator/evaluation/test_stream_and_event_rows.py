"""The kernel side of the two clocks against a profiled step, and a run without host clocks read
as host rows (issue #30): only phases the GPU idled through stand for the host's time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.evaluation import host_check, model_steps, stream_check
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step import host

PROBE = host.HostProbe.from_figures(
    {"eager_op_us": 10.0, "module_call_us": 30.0, "autocast_linear_us": 40.0,
     "linear_us": 15.0, "backward_node_us": 8.0, "optimizer_foreach_us_per_tensor": 2.0,
     "launch_latency_us": 5.0}, "test probe")
CASE = model_steps.SMOKE_CASES[0]  # gpt2-tiny


def measured_row(forward_ms: float, backward_ms: float, inference_ms: float,
                 instrumented: dict[str, Any] | None = None) -> dict[str, Any]:
    phase = {"median_ms": 0.0}
    row: dict[str, Any] = {
        "kind": "model_step", "status": "ok", "model": CASE.name, "batch": CASE.batches[0],
        "precision": "bf16", "framework": "eager", "attention": "sdpa",
        "tf32": {"matmul": False, "cudnn": True},
        "train": {"forward": {"median_ms": forward_ms}, "backward": {"median_ms": backward_ms},
                  "optimizer": {"median_ms": 50.0}, "step": phase},
        "inference": {"forward": {"median_ms": inference_ms}}}
    if instrumented is not None:
        row["instrumented"] = instrumented
    return row


@pytest.fixture(scope="module")
def predictor() -> Any:
    return selection.select_predictor(None, None)[0]


@pytest.fixture(scope="module")
def h200() -> devices.DeviceSpec:
    return devices.resolve_device("NVIDIA H200")


def test_a_phase_the_gpu_idled_through_stands_for_the_hosts_time(
        predictor: Any, h200: devices.DeviceSpec) -> None:
    row = measured_row(forward_ms=40.0, backward_ms=0.01, inference_ms=30.0)
    flat = dict.fromkeys(host_check.EVENT_PHASES, True)
    made = host_check.event_host_row(CASE, row, PROBE, {}, predictor, h200, flat)
    assert made.group == CASE.name and made.autocast
    # forward: 40 ms against well under a millisecond of kernels, so host-bound; backward:
    # shorter than its kernels, so not an issue time; the optimizer's event never is.
    assert made.usable == (True, False, False)
    assert made.measured_host_ms[0] == 40.0
    assert made.inference_usable and made.inference_host_ms == 30.0
    assert made.forward_us["forward_kernel"] > 0 and made.backward_us > 0
    grows = host_check.event_host_row(CASE, row, PROBE, {}, predictor, h200,
                                      {**flat, "forward": False})
    assert grows.usable == (False, False, False)  # the kernels' share, not the host's


def test_a_phase_is_host_time_only_where_the_batch_leaves_it_flat() -> None:
    rows = [{**measured_row(forward, 10.0 * batch, 5.0), "batch": batch}
            for batch, forward in ((4, 20.0), (8, 21.0), (16, 40.0))]
    flat = host_check.batch_flat(rows)
    key = (CASE.name, "bf16")
    assert [flat[(*key, b, "forward")] for b in (4, 8, 16)] == [True, True, False]
    assert not any(flat[(*key, b, "backward")] for b in (4, 8, 16))  # grows with the batch
    assert all(flat[(*key, b, "inference")] for b in (4, 8, 16))


def test_profiled_kernel_time_leaves_the_runtimes_calls_out() -> None:
    kernels = {"count": 5, "total_us": 4000.0, "rest": {"count": 0, "us": 0},
               "top": [{"name": "cudaDeviceSynchronize", "count": 2, "us": 3000.0},
                       {"name": "cudaLaunchKernel", "count": 1, "us": 10.0},
                       {"name": "sm90_xmma_gemm_bf16", "count": 1, "us": 600.0},
                       {"name": "void at::native::vectorized_elementwise_kernel", "count": 1,
                        "us": 390.0}]}
    row = measured_row(1.0, 1.0, 1.0, {"forward": {"kernels": kernels}})
    assert stream_check.profiled_kernel_ms(row, "forward") == pytest.approx(0.99)
    assert stream_check.profiled_kernel_ms(row, "backward") is None
    truncated = {**kernels, "rest": {"count": 3, "us": 50.0}}
    assert stream_check.profiled_kernel_ms(
        measured_row(1.0, 1.0, 1.0, {"forward": {"kernels": truncated}}), "forward") is None


def test_the_check_compares_the_streams_prediction_with_the_profile(
        predictor: Any, h200: devices.DeviceSpec, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    kernels = {"count": 1, "rest": {"count": 0, "us": 0},
               "top": [{"name": "gemm", "count": 1, "us": 1000.0}]}
    row = measured_row(5.0, 5.0, 5.0, {"forward": {"kernels": kernels}})
    (line,) = stream_check.compare([row], predictor, h200)
    busy = estimates.stream_busy_ms(host_check.case_graph(CASE, row, {}), h200,
                                    host_check.train_settings(row), predictor=predictor)
    assert line["predicted_ms"] == pytest.approx(busy[0]) and line["profiled_ms"] == 1.0
    steps = tmp_path / "steps.jsonl"
    steps.write_text("\n".join(json.dumps(r) for r in (
        {"kind": "provenance", "nvml": {"name": "NVIDIA H200"}}, row)) + "\n")
    assert stream_check.run(stream_check.StreamCheckSettings((steps,), None)) == 0
    out = capsys.readouterr().out
    assert "| gpt2-tiny | 2 | bf16 | forward |" in out and "bf16: MAPE" in out
    (tmp_path / "bare.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=r"nvml\.name"):
        stream_check.run(stream_check.StreamCheckSettings((tmp_path / "bare.jsonl",), None))
