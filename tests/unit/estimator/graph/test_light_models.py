"""ONNX's own structure-only ("light") CNNs: every node classified, MACs match publications."""

from __future__ import annotations

import pathlib

import onnx
import pytest

from gpuplan_estimator import graph
from gpuplan_estimator.core.layers import ModelGraph, OpFamily
from gpuplan_estimator.graph import opcost

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
MODELS = sorted(LIGHT.glob("light_*.onnx"))


def macs(g: ModelGraph) -> int:
    """Multiply-accumulates of conv and gemm layers, from their kernel dims."""
    total = 0
    for layer in g.layers:
        kernel, d = opcost.kernel_dims(layer)
        if kernel == "conv2d":
            total += layer.outputs[0].elements * d["c_in"] // d["groups"] * (
                d["kernel_h"] * d["kernel_w"])
        elif kernel == "gemm":
            total += d["batch"] * d["m"] * d["k"] * d["n"]
    return total


def test_light_models_are_present() -> None:
    assert len(MODELS) == 9


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.stem)
def test_every_node_classified(path: pathlib.Path) -> None:
    g = graph.load_model(path, batch=1)
    assert g.unknown_op_types == ()
    assert all(layer.family is not OpFamily.OTHER for layer in g.layers)
    assert g.parameter_count > 0


# Published multiply-accumulates at 224×224 (torchvision model docs, "GFLOPS" = GMACs;
# Simonyan & Zisserman 2015 for VGG-19): the ONNX graphs are the Caffe2 ports.
@pytest.mark.parametrize(("stem", "published_gmacs"), [
    ("light_resnet50", 4.09), ("light_vgg19", 19.63), ("light_densenet121", 2.87),
    ("light_squeezenet", 0.35),
])
def test_macs_match_published(stem: str, published_gmacs: float) -> None:
    g = graph.load_model(LIGHT / f"{stem}.onnx", batch=1)
    assert abs(macs(g) / 1e9 - published_gmacs) / published_gmacs < 0.03


def test_alexnet_macs_by_hand() -> None:
    """BVLC AlexNet is 0.72 G MACs in Caffe, whose pooling rounds up (27×27, 13×13 maps);
    this ONNX port pools with floor (26×26, 12×12), so its graph really does 0.655 G."""

    def alexnet(p1: int, p2: int) -> int:
        c1 = 96 * 54 * 54 * 3 * 121  # 224 input, 11×11 stride 4, no pad
        c2 = 256 * p1 * p1 * 48 * 25  # groups 2
        c3 = 384 * p2 * p2 * 256 * 9
        c4 = 384 * p2 * p2 * 192 * 9
        c5 = 256 * p2 * p2 * 192 * 9
        fc = 256 * 6 * 6 * 4096 + 4096 * 4096 + 4096 * 1000
        return c1 + c2 + c3 + c4 + c5 + fc

    g = graph.load_model(LIGHT / "light_bvlc_alexnet.onnx", batch=1)
    assert macs(g) == alexnet(26, 12)
    assert abs(alexnet(27, 13) / 1e9 - 0.72) / 0.72 < 0.03


def test_resnet50_parameters_and_units() -> None:
    g = graph.load_model(LIGHT / "light_resnet50.onnx", batch=8)
    assert g.parameter_count == 25_557_032  # torchvision resnet50: 25,557,032
    assert sum(u.pattern.startswith("conv_bn") for u in g.units) == 53
    # the input is declared [1, 3, 224, 224]: `batch` binds symbolic dims only, never rewrites
    # a concrete one, so nothing was bound here
    assert g.dim_bindings == {}
    conv = next(layer for layer in g.layers if layer.op_type == "Conv")
    assert conv.inputs[0].shape == (1, 3, 224, 224)
