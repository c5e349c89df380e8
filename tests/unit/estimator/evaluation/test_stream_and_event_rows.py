"""The kernel side of the two clocks against a profiled step, and a run without host clocks read
as host rows (issue #30): only phases the GPU idled through stand for the host's time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost import aligned_gemm
from gpuplan_estimator.evaluation import host_check, model_steps, stream_check
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step import host
from gpuplan_estimator.step.decomposition import build_step

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
                       {"name": "cuLaunchKernelEx", "count": 1, "us": 20.0},
                       {"name": "Activity Buffer Request", "count": 1, "us": 400.0},
                       {"name": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16",
                        "count": 1, "us": 130.0},
                       {"name": "sm90_xmma_gemm_bf16", "count": 1, "us": 600.0},
                       {"name": "void at::native::vectorized_elementwise_kernel", "count": 1,
                        "us": 390.0}]}
    row = measured_row(1.0, 1.0, 1.0, {"forward": {"kernels": kernels}})
    # a cuDNN attention kernel is a kernel, though its name starts as the runtime's calls do
    assert host_check.profiled_kernel_ms(row, "forward") == pytest.approx(1.12)
    assert host_check.profiled_kernel_ms(row, "backward") is None
    truncated = {**kernels, "rest": {"count": 3, "us": 50.0}}
    assert host_check.profiled_kernel_ms(
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


def _gemm_profile(aligned_us: float) -> dict[str, Any]:
    """A profiled forward: aligned wgmma GEMMs, an unaligned LM-head GEMM, fused attention."""
    return {"forward": {"kernels": {"count": 4, "rest": {"count": 0, "us": 0}, "top": [
        {"name": "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_bias_NNT", "count": 4, "us": aligned_us},
        {"name": "void cutlass::Kernel2<cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_"
                 "align1>(Params)", "count": 1, "us": 900.0},
        {"name": "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", "count": 2,
         "us": 700.0},
        {"name": "cudaLaunchKernel", "count": 9, "us": 90.0}]}}}


def test_aligned_rows_pair_the_plan_with_the_profiled_aligned_gemms(
        h200: devices.DeviceSpec) -> None:
    row = measured_row(5.0, 5.0, 5.0, _gemm_profile(aligned_us=400.0))
    (made,) = stream_check.aligned_rows([row], h200)
    assert (made.group, made.kernel_class, made.phase) == (CASE.name, "half", "forward")
    assert made.profiled_ms == pytest.approx(0.4)  # the align1 GEMM and attention left out
    items = build_step(host_check.case_graph(CASE, row, {}), host_check.train_settings(row)).items
    assert made.plan_ms == pytest.approx(stream_check.gemm_plan_ms(items, h200, "half")[
        ("forward", "half")]) and made.plan_ms > 0
    # fp32 rows and rows without a profile give none
    assert stream_check.aligned_rows([{**row, "precision": "fp32"}], h200) == []
    assert stream_check.aligned_rows([measured_row(5.0, 5.0, 5.0)], h200) == []


def test_the_check_writes_each_models_held_out_fit_and_prices_with_it(
        h200: devices.DeviceSpec, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [measured_row(5.0, 5.0, 5.0, _gemm_profile(aligned_us=400.0)),
            {**measured_row(5.0, 5.0, 5.0, _gemm_profile(aligned_us=100.0)),
             "model": model_steps.SMOKE_CASES[1].name}]
    steps = tmp_path / "steps.jsonl"
    steps.write_text("\n".join(json.dumps(r) for r in (
        {"kind": "provenance", "nvml": {"name": "NVIDIA H200"}}, *rows)) + "\n")
    folds_path = tmp_path / "folds.json"
    settings = stream_check.StreamCheckSettings((steps,), None, folds=folds_path)
    assert stream_check.run(settings) == 0
    folds = {g: aligned_gemm.AlignedGemmFit.from_json(doc)
             for g, doc in json.loads(folds_path.read_text()).items()}
    assert sorted(folds) == sorted(r["model"] for r in rows)
    by_model = {r.group: r for r in stream_check.aligned_rows(rows, h200)}
    for model, fold in folds.items():  # each fold is the other model's ratio alone
        (other,) = [r for g, r in by_model.items() if g != model]
        assert fold.log_util["half"] == pytest.approx(other.log_ratio)
    assert "held-out fold" in capsys.readouterr().out


def test_a_vocabulary_sized_unaligned_gemm_is_planned_in_its_own_class(
        h200: devices.DeviceSpec) -> None:
    def gemm(n: int, phase: Phase) -> WorkItem:
        return WorkItem(layer=f"head{n}", family=OpFamily.MATMUL, kernel="gemm", phase=phase,
                        dims={"batch": 1, "m": 2048, "k": 768, "n": n, "bias": 0},
                        dtype="bfloat16", flops=2 * 2048 * 768 * n, bytes_moved=1, op="MatMul")
    items = [gemm(50257, Phase.FORWARD), gemm(3072, Phase.FORWARD), gemm(1001, Phase.BACKWARD)]
    plans = stream_check.gemm_plan_ms(items, h200, "half")
    # the odd 1,001-wide GEMM is the bundle model's (smaller than a vocabulary): no plan
    assert sorted(plans) == [("forward", "half"), ("forward", "half-align1")]
    profile = {"forward": {"kernels": {"count": 2, "rest": {"count": 0, "us": 0}, "top": [
        {"name": "cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align1", "count": 1,
         "us": 1680.0},
        {"name": "nvjet_sm90_tst_128x128_64x6_2x1_v_bz_bias_NNT", "count": 1, "us": 30.0}]}}}
    assert stream_check.profiled_gemm_ms(measured_row(1.0, 1.0, 1.0, profile), "forward",
                                         "half", "bfloat16") == pytest.approx(
        {"half-align1": 1.68, "half": 0.03})



def test_a_host_clocked_phase_is_read_by_its_kernels_not_the_profiles_whole_sum() -> None:
    """GPT-2 small's tf32 backward on the H200: the host issued for 18.3 ms of a 17.4 ms phase
    whose kernels took 13.6 ms, the GPU idle a fifth of it; the profile's 22.2 ms of rows,
    the runtime's calls among them, had read as a GPU busy all along (a blocked host)."""
    kernels = {"count": 3, "total_us": 22200.0, "rest": {"count": 0, "us": 0},
               "top": [{"name": "cudaLaunchKernel", "count": 900, "us": 8600.0},
                       {"name": "sm90_xmma_gemm_f32f32_tf32f32", "count": 100, "us": 13600.0}]}
    row = measured_row(1.0, 17.4, 1.0, {"backward": {"kernels": kernels}})
    row["train"]["host"] = {"forward": {"median_ms": 0.5}, "backward": {"median_ms": 18.3},
                            "optimizer": {"median_ms": 60.0}}
    made = host_check.host_row(CASE, row, PROBE, {})
    assert made.usable[1] and made.measured_host_ms[1] == pytest.approx(18.3)
    blocked = {**kernels, "top": [*kernels["top"][:1],
                                  {**kernels["top"][1], "us": 16500.0}]}
    row["instrumented"] = {"backward": {"kernels": blocked}}
    assert not host_check.host_row(CASE, row, PROBE, {}).usable[1]


def test_profiled_kernels_and_planned_items_fall_in_the_same_classes() -> None:
    names = {
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26": "attention",
        "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*)": "attention",
        "fmha_cutlassB_f32_aligned_64x64_k64_dropout_sm80(PyTorchMemEffAttention": "attention",
        "nvjet_sm90_tst_96x128_64x6_2x1_v_bz_bias_NNN": "gemm",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float>": "gemm",
        "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc": "conv2d",
        "void at::native::unrolled_elementwise_kernel<at::native::CUDAFunctor_add<float>>": (
            "unrolled"),
        "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_"
        "cuda(at::TensorIteratorBase&)::{lambda(float)#1}>": "cast",
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float>>": "reduce",
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate": (
            "layernorm"),
        "void at::native::vectorized_elementwise_kernel<4, at::native::tanh_kernel_cuda>": (
            "elementwise"),
        "Memset (Device)": "other",
    }
    assert {n: stream_check.profiled_class(n) for n in names} == names
    step = build_step(host_check.case_graph(CASE, measured_row(1.0, 1.0, 1.0), {}),
                      host_check.train_settings(measured_row(1.0, 1.0, 1.0)))
    classes = {stream_check.plan_class(i) for i in step.items if i.kernel != "none"}
    # GPT-2 under bf16: its residual adds run unrolled, its weights are cast down
    assert {"gemm", "unrolled", "cast", "elementwise", "layernorm"} <= classes
    assert classes <= {c for c, _ in stream_check.PROFILED_CLASSES}


def test_the_check_sets_each_class_of_the_plan_beside_the_profiles(
        predictor: Any, h200: devices.DeviceSpec) -> None:
    kernels = {"count": 3, "rest": {"count": 0, "us": 0}, "top": [
        {"name": "nvjet_sm90_tst_96x128_64x6_2x1_v_bz_bias_NNN", "count": 2, "us": 500.0},
        {"name": "void at::native::unrolled_elementwise_kernel<add>", "count": 1, "us": 30.0},
        {"name": "cudaLaunchKernel", "count": 3, "us": 30.0}]}
    row = measured_row(5.0, 5.0, 5.0, {"forward": {"kernels": kernels}})
    rows = {r["class"]: r for r in stream_check.class_rows([row], predictor, h200)}
    assert (rows["gemm"]["profiled_kernels"], rows["gemm"]["profiled_ms"]) == (2.0, 0.5)
    assert rows["unrolled"]["profiled_ms"] == pytest.approx(0.03)
    assert all(r["phase"] == "forward" for r in rows.values())  # backward was not profiled
    planned = estimates.stream_rows(host_check.case_graph(CASE, row, {}), h200,
                                    host_check.train_settings(row), predictor=predictor)
    forward = sum(r.ms for r in planned if r.phase is Phase.FORWARD)
    assert sum(r["plan_ms"] for r in rows.values()) == pytest.approx(forward)
    assert rows["unrolled"]["plan_kernels"] > 0
