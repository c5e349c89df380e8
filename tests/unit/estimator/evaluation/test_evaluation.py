"""evaluation: label parsing, whole-model rows on a tiny GPT-2, metrics, report files, CPU loop."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.evaluation import cpu_loop, gpu_labels, pages, publishing, report
from gpuplan_estimator.graph import batching
from gpuplan_estimator.interfaces.cli import evaluation as eval_cli
from gpuplan_estimator.interfaces.cli import render

HEADER = "gpu,model,mode,seq_len,batch,fusion,e2e_latency_ms,fw_ms,bw_ms,num_layer\n"
TINY_GPT2 = {
    "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 32, "n_head": 2,
    "n_layer": 1, "n_positions": 64, "vocab_size": 100, "n_inner": None,
    "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
}


def _labels(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "labels.csv"
    path.write_text(HEADER + body, encoding="utf-8")
    return path


def test_read_labels_modes_and_measured(tmp_path: Path) -> None:
    rows = gpu_labels.read_labels(_labels(tmp_path, (
        "Tesla_T4,tiny,inf,16,2,no,5.0,5.0,0.0,1\n"
        "Tesla_V100-PCIE-32GB,tiny,train,16,2,yes,9.0,3.0,6.0,1\n")))
    assert [r.mode for r in rows] == ["inference", "train"]
    assert rows[0].measured_ms == 5.0 and rows[1].measured_ms == 9.0 and rows[1].fused
    # compiled training has no fused pricing (folds have no backward): priced as eager
    assert [gpu_labels.row_framework(r) for r in rows] == ["pytorch-eager", "pytorch-eager"]
    compiled = dataclasses.replace(rows[0], fused=True)
    assert gpu_labels.row_framework(compiled) == "pytorch-compiled"
    cat = devices.load_catalog()
    assert [gpu_labels.label_device(r, cat).key for r in rows] == ["t4", "v100-pcie-32gb"]


@pytest.mark.parametrize("body,match", [
    ("Tesla_T4,tiny,eval,16,2,no,5,5,0,1\n", "mode"),
    ("Tesla_T4,tiny,inf,16,2,maybe,5,5,0,1\n", "fusion"),
    ("Tesla_T4,tiny,inf,x,2,no,5,5,0,1\n", "bad number"),
    ("Tesla_T4,tiny,inf,16,2,no,0,0,0,1\n", "positive"),
])
def test_read_labels_errors_name_line(tmp_path: Path, body: str, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match) as exc:
        gpu_labels.read_labels(_labels(tmp_path, body))
    assert "labels.csv:2" in str(exc.value)


def test_read_labels_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "labels.csv"
    path.write_text("gpu,model\nTesla_T4,x\n", encoding="utf-8")
    with pytest.raises(InvalidRequestError, match="missing columns"):
        gpu_labels.read_labels(path)


def _tiny_rows(tmp_path: Path) -> tuple[gpu_labels.LabelRow, ...]:
    (tmp_path / "tiny.json").write_text(json.dumps(TINY_GPT2), encoding="utf-8")
    return gpu_labels.read_labels(_labels(tmp_path, (
        "Tesla_T4,tiny,inf,16,2,no,5.0,5.0,0.0,1\n"
        "Tesla_T4,tiny,train,16,2,no,9.0,3.0,6.0,1\n"
        "Tesla_T4,switchxl4,inf,16,2,no,9.0,9.0,0.0,1\n")))


def test_evaluate_rows_prices_forward_and_training(tmp_path: Path) -> None:
    rows = _tiny_rows(tmp_path)
    results, skipped = gpu_labels.evaluate_rows(
        rows, predictors={"roofline": roofline.RooflinePredictor()},
        catalog=devices.load_catalog(), build_graph=gpu_labels.zoo_graph_builder(tmp_path))
    assert [s.row.model for s in skipped] == ["switchxl4"]
    inf, tr = results
    # Same graph, same device: the training row's forward adds the loss and dropout
    # (`step.training_ops`) to the inference forward, and backward after it.
    assert tr.forward_ms > inf.forward_ms
    assert inf.predicted_ms == pytest.approx(inf.forward_ms)
    assert tr.predicted_ms > 2 * tr.forward_ms  # backward of matmuls is two matmuls
    assert inf.p10_ms <= inf.predicted_ms <= inf.p90_ms
    assert inf.ape == pytest.approx(abs(inf.predicted_ms - 5.0) / 5.0)


def test_metrics_known_values() -> None:
    m = report.metrics([0.1, 0.2, 0.3, 0.4], [True, False, True, True])
    assert m.mape_pct == pytest.approx(25.0)
    assert m.p90_ape_pct == pytest.approx(37.0)
    assert m.coverage_pct == pytest.approx(75.0)
    with pytest.raises(ValueError):
        report.metrics([], [])


def _row(model: str, device: str, measured: float, predicted: float) -> gpu_labels.RowResult:
    row = gpu_labels.LabelRow(device, model, "inference", 16, 2, False, measured, measured, 0.0)
    return gpu_labels.RowResult(row, device, eval_cli.LGB, predicted, predicted * 0.9,
                                predicted * 1.1, predicted)


def test_calibrated_uses_only_other_models() -> None:
    # Models a and b are 25 % over-predicted; c is exact. c's correction comes from a and b only.
    results = [_row("a", "t4", 100.0, 125.0), _row("b", "t4", 100.0, 125.0),
               _row("c", "t4", 100.0, 100.0)]
    out = {r.row.model: r for r in eval_cli.calibrated(results, hold_out_device=False)}
    assert out["c"].predicted_ms < 100.0  # pulled toward 0.8 by the others
    assert out["a"].predicted_ms > 100.0  # b says 0.8, c says 1.0: a is corrected less
    assert all(r.predictor == eval_cli.CALIBRATED for r in out.values())
    held = eval_cli.calibrated(results, hold_out_device=True)
    assert [r.predicted_ms for r in held] == pytest.approx([125.0, 125.0, 100.0])


def _report() -> report.Report:
    gpu = (_row("a", "t4", 100.0, 110.0), _row("b", "t4", 200.0, 180.0))
    cpu = (cpu_loop.CpuResult("resnet50", 1, "roofline", 50.0, 40.0, 60.0, 55.0, 3),)
    return report.Report(
        measured=report.Provenance("2026-01-02T03:04:05+00:00", "abc123", "gpuplan eval"),
        bundle="b", gpu=gpu, skipped=(), logo=gpu, cpu=cpu, notes=("a note",),
        host=report.Host("Some CPU", 2, 100.0, 10.0),
        cpu_models=(report.CpuModels("onnxruntime", "host-bench", 500, 1.07, 48),))


def test_report_markdown_and_json() -> None:
    rep = _report()
    text = pages.to_markdown(rep, roots={})
    assert "`gpuplan eval`" in text and "abc123" in text and "a note" in text
    assert "| t4 | inference | 2 | 10.0 | " in text
    doc = json.loads(json.dumps(report.to_json(rep)))
    summary = doc["cpu_closed_loop"]["summary"]
    assert summary["inference all"]["mape_pct"] == pytest.approx(9.09, abs=0.01)
    assert doc["gpu_labels"]["summary"][0]["mape_pct"] == pytest.approx(10.0)


def test_a_carried_over_cpu_loop_keeps_its_own_provenance(tmp_path: Path) -> None:
    earlier = report.Provenance("2026-01-01T00:00:00+00:00", "cpu0001", "gpuplan eval --cpu-runs 9")
    saved = tmp_path / "accuracy.json"
    saved.write_text(json.dumps(report.to_json(_report())), encoding="utf-8")
    carried = eval_cli.saved_cpu_loop(saved)
    assert carried.cpu == _report().cpu and carried.host == _report().host
    rep = dataclasses.replace(_report(), cpu_measured=earlier)
    assert report.from_json(json.loads(json.dumps(report.to_json(rep)))).cpu_measured == earlier
    text = pages.to_markdown(rep, roots={})
    assert ("CPU closed loop measured 2026-01-01T00:00:00+00:00 at commit `cpu0001` by "
            "`gpuplan eval --cpu-runs 9`, carried over") in text
    assert "gpuplan eval --cpu-runs 9   # measure everything, CPU loop included" in text
    args = argparse.Namespace(labels=None, bundle=None, no_logo=False, logo_max_rows=15000,
                              cpu_from=saved, no_cpu=False)
    command = eval_cli.command_line(args, {})
    assert command.startswith("gpuplan eval --logo-max-rows 15000 --cpu-from ")
    assert command.endswith("accuracy.json") and "--cpu-runs" not in command


def test_a_saved_run_without_a_cpu_loop_cannot_lend_one(tmp_path: Path) -> None:
    saved = tmp_path / "gpu-only.json"
    saved.write_text(json.dumps(report.to_json(dataclasses.replace(_report(), cpu=()))),
                     encoding="utf-8")
    with pytest.raises(InvalidRequestError, match=r"--cpu-from.*no CPU closed loop"):
        eval_cli.saved_cpu_loop(saved)
    with pytest.raises(InvalidRequestError, match="--cpu-from"):
        eval_cli.saved_cpu_loop(tmp_path / "missing.json")


@pytest.mark.slow  # importing matplotlib alone takes seconds on a loaded 2-core machine
def test_report_files(tmp_path: Path) -> None:
    written = publishing.write(_report(), tmp_path, roots={})
    assert [p.name for p in written] == ["accuracy.md", "accuracy.json",
                                         "accuracy-residuals.png", "accuracy-coverage.png"]
    assert json.loads(written[1].read_text(encoding="utf-8"))["measured"]["commit"] == "abc123"
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in written[2:])


def _tiny_batch1_model() -> onnx.ModelProto:
    """Conv → Reshape([1, -1]) at batch 1, like the light models' classifier heads."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.zeros(108, np.float32))
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["y"])]
    g = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])], [w, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_evaluate_model_predicts_and_measures(tmp_path: Path) -> None:
    path = tmp_path / "light_tiny.onnx"
    onnx.save(_tiny_batch1_model(), path)
    device = devices.load_catalog().resolve("t4")  # any spec: the pricing path is what's tested
    result = cpu_loop.evaluate_model(path, 8, device=device, predictor=roofline.RooflinePredictor(),
                                     settings=cpu_loop.CpuTimingSettings(runs=3, threads=1))
    assert (result.model, result.batch, result.runs) == ("tiny", 8, 3)
    assert result.predicted_ms > 0 and result.measured_ms > 0
    assert math.isfinite(result.ape)



def test_estimate_explain_lists_every_layer() -> None:
    from gpuplan_estimator import graph
    from gpuplan_estimator.interfaces.cli import main
    from gpuplan_estimator.planning import estimates
    from gpuplan_estimator.step.decomposition import TrainingSettings

    ns = main.build_parser(plugins=False).parse_args(["estimate", "m.onnx", "--explain"])
    assert ns.explain
    g = graph.load_model(_tiny_batch1_model().SerializeToString(), name="tiny")
    (est,) = estimates.estimate(g, [devices.load_catalog().resolve("t4")],
                               TrainingSettings(batch_size=1, mode="inference"),
                               predictor=roofline.RooflinePredictor())
    lines = render.explain_lines(est, layers=True)
    assert lines[0] == "explain t4:" and "  by op type:" in lines
    every = lines.index("  every layer (most expensive first): layer, op, fwd ms, bwd ms, "
                        "p10-p90 ms, predictor, cum %")
    assert len(lines) == every + 1 + len(g.layers)
    assert lines[-1].rstrip().endswith("100.0")  # the running share ends at the whole step


def test_measure_keeps_the_median_session_and_checks_sessions() -> None:
    model = batching.fixed_batch(_tiny_batch1_model(), 2).SerializeToString()
    ticks = iter(np.arange(0.0, 1e6, 0.5))  # every clock read advances 0.5 s: means are exact
    measured = cpu_loop.measure_ms(model, cpu_loop.CpuTimingSettings(runs=2, sessions=3, threads=1),
                                   clock=lambda: float(next(ticks)))
    assert measured == pytest.approx(500.0)
    with pytest.raises(InvalidRequestError, match="sessions"):
        cpu_loop.measure_ms(model, cpu_loop.CpuTimingSettings(sessions=0))
