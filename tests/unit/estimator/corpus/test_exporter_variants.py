"""Exports as they come: weights in an external-data file, TorchScript opsets 11 to 17,
dynamo's opset 18 and up, and fp16/bf16 graphs."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
import torch

from campaigns import corpus
from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, graph, load_catalog
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.graph import exporting


def _matmul_conv_flops(g: graph.ModelGraph) -> int:
    return sum(layer.flops for layer in g.layers
               if layer.family in (OpFamily.MATMUL, OpFamily.CONV))


def _torchscript(name: str, path: Path, opset: int) -> Path:
    case = corpus.CASES_BY_NAME[name]
    torch.manual_seed(0)
    with exporting.quiet_exporter():
        torch.onnx.export(case.build("small").eval(), case.example("small"), str(path),
                          dynamo=False, opset_version=opset)
    return path


def test_weights_in_an_external_data_file_are_never_read(tmp_path: Path) -> None:
    """The graph names its weights' file; the estimator needs only their dims, so it loads
    with the data file gone."""
    full = _torchscript("bert", tmp_path / "full.onnx", 17)
    model = onnx.load(str(full))
    onnx.save(model, str(tmp_path / "bert.onnx"), save_as_external_data=True,
              all_tensors_to_one_file=True, location="bert.data", size_threshold=0)
    (tmp_path / "bert.data").unlink()
    g = graph.load_model(tmp_path / "bert.onnx")
    reference = graph.load_model(full)
    assert g.parameter_count == reference.parameter_count > 0
    assert _matmul_conv_flops(g) == _matmul_conv_flops(reference)


@pytest.mark.parametrize(("name", "opset"),
                         [("resnet50", 11), ("convnext_tiny", 13), ("bert", 14), ("t5", 14)])
def test_torchscript_exports_from_opset_11_estimate(name: str, opset: int,
                                                    tmp_path: Path) -> None:
    g = graph.load_model(_torchscript(name, tmp_path / f"{name}-{opset}.onnx", opset))
    assert g.opset == opset and g.unknown_op_types == ()
    reference, _ = corpus.reference_flops(corpus.CASES_BY_NAME[name], "small")
    assert _matmul_conv_flops(g) == pytest.approx(reference, rel=0.02)


@pytest.mark.parametrize(("name", "dtype", "expected"), [
    ("llama", torch.bfloat16, "bfloat16"), ("resnet50", torch.float16, "float16")])
def test_half_precision_graphs_estimate_in_their_dtype(name: str, dtype: torch.dtype,
                                                       expected: str) -> None:
    case = corpus.CASES_BY_NAME[name]
    with torch.device("meta"):
        module = case.build("small").eval().to(dtype)
    args = tuple(a.to("meta", dtype) if a.is_floating_point() else a.to("meta")
                 for a in case.example("small"))
    g = graph.load_model(exporting.export_module(module, args, label=name))
    assert g.opset >= 18 and g.unknown_op_types == ()
    compute = [layer for layer in g.layers if layer.family in (OpFamily.MATMUL, OpFamily.CONV)]
    assert {layer.outputs[0].dtype for layer in compute} == {expected}
    a100 = load_catalog().resolve("a100-sxm4-80gb")
    (result,) = estimate(g, [a100], TrainingSettings(batch_size=case.batch, precision="bf16"),
                         predictor=RooflinePredictor())
    assert result.step_time_ms > 0
