"""#35: a graph whose BatchNorm the export folded into Conv is named, with the fix, when priced
for training. The exports are real torch.onnx outputs (tests/fixtures/exports/make_exports.py)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from gpuplan_estimator.graph import export_checks, loading

EXPORTS = Path(__file__).resolve().parents[3] / "fixtures" / "exports"
LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize(("name", "evidence"), [
    ("torchscript-eval", "TorchScript-exporter constants"),
    ("dynamo-default", "'FuseBatchNormIntoConv' rewrite"),
    ("torchscript-train", ""),
    ("dynamo-optimize-off", ""),
])
def test_each_exporter_s_folding_is_told_apart_from_a_training_export(name: str,
                                                                       evidence: str) -> None:
    found = export_checks.folded_batchnorm(onnx.load(EXPORTS / f"cnn-{name}.onnx"))
    assert (evidence in found) if evidence else found == ""
    if evidence:
        assert found.startswith("4 of its 4 Conv")


def test_a_graph_with_batchnorm_or_without_convolutions_is_not_flagged() -> None:
    assert export_checks.folded_batchnorm(onnx.load(LIGHT / "light_resnet50.onnx")) == ""
    assert export_checks.folded_batchnorm(onnx.load(LIGHT / "light_bvlc_alexnet.onnx")) == ""
    # VGG-19 never had BatchNorm, and reads like a folded one: hence the hedged wording.
    assert "looks the same" in export_checks.folded_batchnorm(
        onnx.load(LIGHT / "light_vgg19.onnx"))


def _biased_cnn(convs: int, norm: str | None) -> onnx.ModelProto:
    """`convs` 3x3 convs with a bias each (no producer metadata), optionally a norm op."""
    nodes, inits, x = [], [], "x"
    for i in range(convs):
        inits += [helper.make_tensor(f"w{i}", TensorProto.FLOAT, [4, 4, 3, 3], [0.0] * 144),
                  helper.make_tensor(f"b{i}", TensorProto.FLOAT, [4], [0.0] * 4)]
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], pads=[1] * 4))
        x = f"c{i}"
    if norm:
        nodes.append(helper.make_node(norm, [x], ["y"]))
        x = "y"
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 4, 8, 8])], [helper.make_tensor_value_info(
            x, TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph)


def test_an_unlabelled_cnn_with_biased_convs_and_no_norm_is_worded_as_a_likelihood() -> None:
    found = export_checks.folded_batchnorm(_biased_cnn(export_checks.MIN_CONVS, None))
    assert "all 4 Conv nodes have a bias" in found and "looks the same" in found
    assert export_checks.folded_batchnorm(_biased_cnn(export_checks.MIN_CONVS - 1, None)) == ""
    assert export_checks.folded_batchnorm(_biased_cnn(4, "LpNormalization")) == ""


def test_only_training_is_warned_and_the_warning_gives_both_exporters_fixes() -> None:
    assert export_checks.training_warnings("inference", "why") == []
    assert export_checks.training_warnings("train", "") == []
    [warning] = export_checks.training_warnings("train", "why")
    assert "why" in warning
    assert "training=torch.onnx.TrainingMode.TRAINING" in warning
    assert "optimize=False" in warning


def test_the_loaded_graph_carries_the_evidence_and_the_training_export_prices_more_memory(
) -> None:
    folded = loading.load_model(EXPORTS / "cnn-torchscript-eval.onnx", batch=64)
    kept = loading.load_model(EXPORTS / "cnn-torchscript-train.onnx", batch=64)
    assert "TorchScript" in folded.folded_batchnorm and kept.folded_batchnorm == ""
    assert sum(layer.op_type == "BatchNormalization" for layer in kept.layers) == 4
