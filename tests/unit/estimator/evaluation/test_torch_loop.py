"""CPU training step: light models with real weights, converted by onnx2torch, one SGD step
timed with real PyTorch and priced by the estimator."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator.core import errors, progress
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.devices import local_cpu
from gpuplan_estimator.evaluation import cpu_loop, torch_loop
from gpuplan_estimator.interfaces.cli import evaluation as eval_cli
from gpuplan_estimator.latency.bundles import Bundle

FAST = cpu_loop.CpuTimingSettings(runs=2, threads=1)


def constant_weight_model() -> onnx.ModelProto:
    """Conv whose weight is a ConstantOfShape output and whose bias is an initializer that is
    also a graph input (IR 3), as in the light models."""
    shape = numpy_helper.from_array(np.array([4, 3, 3, 3], np.int64), "w_shape")
    bias = numpy_helper.from_array(np.full(4, 0.1, np.float32), "b")
    nodes = [helper.make_node("ConstantOfShape", ["w_shape"], ["w"],
                              value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.02])),
             helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])]
    inputs = [helper.make_tensor_value_info("b", TensorProto.FLOAT, [4]),
              helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    g = helper.make_graph(nodes, "weights", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                          [shape, bias])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)


def test_with_weights_makes_random_initializers_and_keeps_only_free_inputs() -> None:
    out = torch_loop.with_weights(constant_weight_model(), np.random.default_rng(0))
    assert [n.op_type for n in out.graph.node] == ["Conv"]
    assert [i.name for i in out.graph.input] == ["x"] and out.ir_version >= 4
    w = numpy_helper.to_array(next(t for t in out.graph.initializer if t.name == "w"))
    assert w.shape == (4, 3, 3, 3) and w.dtype == np.float32 and w.std() > 0
    session = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"])
    (y,) = session.run(None, {"x": np.ones((1, 3, 8, 8), np.float32)})
    assert y.shape == (1, 4, 8, 8)


def test_converted_module_matches_onnxruntime() -> None:
    weighted = torch_loop.with_weights(constant_weight_model(), np.random.default_rng(1))
    import torch

    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    module = torch_loop.to_torch(weighted)
    session = ort.InferenceSession(weighted.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (expected,) = session.run(None, {"x": x})
    with torch.no_grad():
        got = module(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def test_training_step_of_a_real_light_model_is_priced_and_measured() -> None:
    path = cpu_loop.light_dir() / "light_shufflenet.onnx"
    result = torch_loop.evaluate_model(path, 1, device=local_cpu.local_cpu_device(),
                                       predictor=roofline.RooflinePredictor(), settings=FAST)
    assert (result.model, result.mode, result.batch, result.runs) == ("shufflenet", "train", 1, 2)
    assert result.predicted_ms > 0 and result.measured_ms > 0
    inference = cpu_loop.evaluate_model(path, 1, device=local_cpu.local_cpu_device(),
                                        predictor=roofline.RooflinePredictor(), settings=FAST)
    assert result.predicted_ms > 2 * inference.predicted_ms  # backward and optimizer priced
    assert result.measured_ms > inference.measured_ms


def test_unconvertible_model_names_the_model() -> None:
    proto = onnx.load(str(cpu_loop.light_dir() / "light_vgg19.onnx"))
    weighted = torch_loop.with_weights(proto, np.random.default_rng(0))
    with pytest.raises(errors.InvalidModelError, match="cannot convert"):
        torch_loop.to_torch(weighted)


def test_every_listed_model_converts() -> None:
    for name in torch_loop.CONVERTIBLE:
        proto = onnx.load(str(cpu_loop.light_dir() / f"light_{name}.onnx"))
        module = torch_loop.to_torch(torch_loop.with_weights(proto, np.random.default_rng(0)))
        assert sum(p.numel() for p in module.parameters()) > 1_000_000, name


def test_bundle_without_torch_rows_is_refused_by_flag() -> None:
    empty = Bundle(models={}, manifest={"backends": ["pytorch-2.1.0+cu121"]}, path=Path("."))
    with pytest.raises(errors.InvalidRequestError, match="--torch-bench-minutes"):
        eval_cli.host_cpu_models(empty, "torch", 0.0, 10, argparse.Namespace())


def test_training_steps_loop_reports_progress_per_model_and_batch() -> None:
    said: list[progress.Step] = []
    results = torch_loop.evaluate_training_steps(
        device=local_cpu.local_cpu_device(), predictor=roofline.RooflinePredictor(),
        settings=FAST, models=("shufflenet",), batches=(1,), progress=said.append)
    assert [(r.model, r.mode, r.batch) for r in results] == [("shufflenet", "train", 1)]
    assert [(s.task, s.done, s.total) for s in said] == [
        ("eval: CPU training step", 0, 1), ("eval: CPU training step", 1, 1)]
    assert said[1].item.startswith("shufflenet b1: predicted")
