"""framework: onnxruntime prices a fusion unit as one kernel; PyTorch eager per node.

Graphs are real ONNX models parsed by `graph`; numbers are worked out by hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import onnx
import pytest
from onnx import TensorProto, helper

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step import frameworks, layout_credits
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step

F = TensorProto.FLOAT


def load(nodes: list[onnx.NodeProto], inits: list[onnx.TensorProto], shape: list[int]) -> Any:
    m = helper.make_model(
        helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, shape)],
                          [helper.make_tensor_value_info("y", F, None)], initializer=inits),
        opset_imports=[helper.make_opsetid("", 17)])
    return graph.load_model(m.SerializeToString())


def const(name: str, *shape: int) -> onnx.TensorProto:
    return helper.make_tensor(name, F, list(shape), [0.5] * math.prod(shape))


def ort(batch: int = 2) -> TrainingSettings:
    return TrainingSettings(batch_size=batch, mode="inference", framework="onnxruntime")


def eager(batch: int = 2) -> TrainingSettings:
    return TrainingSettings(batch_size=batch, mode="inference")


def conv_bn_relu() -> Any:
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "s", "b", "m", "v"], ["n"], name="bn"),
             helper.make_node("Relu", ["n"], ["y"], name="relu")]
    inits = [const("w", 4, 3, 3, 3)] + [const(n, 4) for n in "sbmv"]
    return load(nodes, inits, [2, 3, 8, 8])


def test_onnxruntime_folds_batchnorm_and_activation_into_the_conv() -> None:
    g = conv_bn_relu()
    step = build_step(g, ort())
    assert [(i.layer, i.kernel, i.role) for i in step.forward] == [
        ("conv", "conv2d", "fwd"), ("bn", "none", "fused"), ("relu", "none", "fused")]
    assert step.fused == ("bn", "relu")
    assert step.shape_only == ()
    # Eager runs all three kernels (an eval-mode batch norm is one elementwise pass).
    assert [(i.kernel, i.op) for i in build_step(g, eager()).forward] == [
        ("conv2d", "Conv"), ("elementwise", "mulu"), ("elementwise", "relu")]


def test_onnxruntime_gemm_takes_the_bias_and_activation() -> None:
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"),
             helper.make_node("Add", ["h", "b"], ["hb"], name="bias"),
             helper.make_node("Relu", ["hb"], ["y"], name="relu")]
    g = load(nodes, [const("w", 8, 4), const("b", 4)], [2, 8])
    (mm, bias, relu) = build_step(g, ort()).forward
    assert (mm.kernel, dict(mm.dims)) == ("gemm", {"batch": 1, "m": 2, "k": 8, "n": 4,
                                                   "bias": 1})
    # 2·m·k·n + m·n bias adds = 2·2·8·4 + 8; bytes: x 16 + W 32 + y 8 + b 4 floats.
    assert (mm.flops, mm.bytes_moved) == (136, 4 * 60)
    assert (bias.kernel, relu.kernel) == ("none", "none")


def test_onnxruntime_runs_decomposed_gelu_and_layernorm_as_one_kernel() -> None:
    nodes = [helper.make_node("ReduceMean", ["x"], ["mu"], name="mean", axes=[-1]),
             helper.make_node("Sub", ["x", "mu"], ["d"], name="sub"),
             helper.make_node("Pow", ["d", "two"], ["sq"], name="pow"),
             helper.make_node("ReduceMean", ["sq"], ["var"], name="var", axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["ve"], name="eps"),
             helper.make_node("Sqrt", ["ve"], ["std"], name="sqrt"),
             helper.make_node("Div", ["d", "std"], ["nrm"], name="div"),
             helper.make_node("Mul", ["nrm", "gamma"], ["sc"], name="gamma"),
             helper.make_node("Add", ["sc", "beta"], ["ln"], name="beta"),
             helper.make_node("Div", ["ln", "sqrt2"], ["q"], name="gdiv"),
             helper.make_node("Erf", ["q"], ["e"], name="erf"),
             helper.make_node("Add", ["e", "one"], ["a"], name="gadd"),
             helper.make_node("Mul", ["ln", "a"], ["gm"], name="gmul"),
             helper.make_node("Mul", ["gm", "half"], ["y"], name="ghalf")]
    inits = [const("two"), const("eps"), const("gamma", 8), const("beta", 8), const("sqrt2"),
             const("one"), const("half")]
    g = load(nodes, inits, [2, 8])
    step = build_step(g, ort())
    priced = [i for i in step.forward if i.kernel != "none"]
    assert [(i.layer, i.kernel, i.op, dict(i.dims)) for i in priced] == [
        ("beta", "layernorm", "LayerNormalization", {"rows": 2, "cols": 8}),
        ("ghalf", "elementwise", "gelu", {"rows": 2, "cols": 8, "operands": 1})]
    # layernorm: 8 FLOPs × 16 elements; reads x, gamma, beta, writes y: (16+8+8+16) floats.
    # gelu: 8 FLOPs × 16; reads and writes 16 floats.
    assert [(i.flops, i.bytes_moved) for i in priced] == [(128, 4 * 48), (128, 4 * 32)]
    assert len(step.fused) == 12


def test_onnxruntime_is_cheaper_than_eager_on_the_roofline() -> None:
    g = conv_bn_relu()
    dev = devices.load_catalog().resolve("v100-pcie-32gb")
    pred = roofline.RooflinePredictor()
    (o,) = estimates.estimate(g, [dev], ort(), predictor=pred)
    (e,) = estimates.estimate(g, [dev], eager(), predictor=pred)
    (conv_only,) = estimates.estimate(load([helper.make_node(
        "Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], [const("w", 4, 3, 3, 3)],
        [2, 3, 8, 8]), [dev], eager(), predictor=pred)
    assert o.forward_ms == pytest.approx(conv_only.forward_ms)
    assert o.forward_ms < e.forward_ms


def test_framework_is_validated() -> None:
    bad = TrainingSettings(batch_size=2, mode="inference", framework="tensorflow")
    assert bad.validate() == (
        "framework: must be one of pytorch-eager, onnxruntime, pytorch-compiled, "
        "got 'tensorflow'",)
    train = TrainingSettings(batch_size=2, framework="onnxruntime")
    with pytest.raises(InvalidRequestError, match="framework"):
        train.check()
    with pytest.raises(InvalidRequestError, match="framework"):
        frameworks.overrides(conv_bn_relu(), "tensorflow")
    assert frameworks.overrides(conv_bn_relu(), "pytorch-eager") == {}


def test_compiled_folds_attention_scale_mask_and_residual_add() -> None:
    # x [2,4,8]: scores = x·xᵀ [2,4,4] / 2 + mask [1,1,4] -> softmax; then a residual
    # Add of two full-size [2,4,8] tensors feeding a LayerNormalization.
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("Transpose", ["h"], ["ht"], name="kt", perm=[0, 2, 1]),
             helper.make_node("MatMul", ["h", "ht"], ["sc"], name="scores"),
             helper.make_node("Div", ["sc", "root"], ["ss"], name="scale"),
             helper.make_node("Add", ["ss", "mask"], ["sm"], name="mask"),
             helper.make_node("Softmax", ["sm"], ["p"], name="softmax", axis=-1),
             helper.make_node("MatMul", ["p", "h"], ["ctx"], name="context"),
             helper.make_node("Add", ["ctx", "h"], ["res"], name="residual"),
             helper.make_node("LayerNormalization", ["res", "g", "b"], ["y"], name="ln")]
    inits = [const("root"), const("mask", 1, 1, 4), const("g", 8), const("b", 8)]
    g = load(nodes, inits, [2, 4, 8])
    step = build_step(g, TrainingSettings(batch_size=2, mode="inference",
                                          framework="pytorch-compiled"))
    assert step.fused == ("scale", "mask", "residual")
    priced = [(i.layer, i.kernel) for i in step.forward if i.kernel != "none"]
    # xᵀ is a view the GEMM reads through its transpose flag (`step.views`), compiled or not.
    assert priced == [("relu", "elementwise"), ("scores", "gemm"),
                      ("softmax", "softmax"), ("context", "gemm"), ("ln", "layernorm")]
    # onnxruntime keeps the attention chain per node (no transformers optimizer) and the add.
    ort_step = build_step(g, ort())
    assert ort_step.fused == ()
    with pytest.raises(InvalidRequestError, match="inference only"):
        TrainingSettings(batch_size=2, framework="pytorch-compiled").check()


def test_onnxruntime_prices_average_pool_as_its_blocked_pool_kernel() -> None:
    nodes = [helper.make_node("AveragePool", ["x"], ["y"], name="avg", kernel_shape=[3, 3],
                              strides=[1, 1])]
    g = load(nodes, [], [2, 16, 8, 8])
    (ort_item,) = build_step(g, ort()).forward
    assert (ort_item.kernel, ort_item.op) == ("pool", "MaxPool")
    (eager_item,) = build_step(g, eager()).forward
    assert (eager_item.kernel, eager_item.op) == ("pool", "AveragePool")


@pytest.mark.parametrize("framework", [ort, eager])
def test_concat_is_one_contiguous_copy_in_every_framework(
        framework: Callable[[], TrainingSettings]) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Concat", ["x", "r"], ["y"], name="cat", axis=1)]
    g = load(nodes, [], [2, 16, 8, 8])
    cat = {i.layer: i for i in build_step(g, framework()).forward}["cat"]
    assert (cat.kernel, cat.op) == ("elementwise", "Concat")
    assert cat.dims == {"rows": 2 * 32 * 8, "cols": 8, "operands": 1}


def conv_chain(c_mid: int = 32, groups: int = 1) -> Any:
    """conv (16 -> c_mid) -> relu -> conv (c_mid -> 32, `groups`) -> reshape."""
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
             helper.make_node("Conv", ["r1", "w2"], ["c2"], name="conv2", group=groups),
             helper.make_node("Reshape", ["c2", "shape"], ["y"], name="flat")]
    inits = [const("w1", c_mid, 16, 3, 3), const("w2", 32, c_mid // groups, 1, 1),
             helper.make_tensor("shape", TensorProto.INT64, [2], [2, -1])]
    return load(nodes, inits, [2, 16, 8, 8])


def credits(g: Any, name: str) -> Any:
    return layout_credits.credits_for(g, name, frameworks.overrides(g, name))


def test_onnxruntime_credits_the_nchwc_reorders_a_conv_chain_skips() -> None:
    g = conv_chain()
    # conv1's output and conv2's input stay blocked (the ReLU keeps the layout); the graph
    # input and conv2's output (read by a Reshape) are reordered in the model as in the bench.
    assert credits(g, "onnxruntime") == {
        "conv1": 2 * 32 * 8 * 8, "conv2": 2 * 32 * 8 * 8}
    assert credits(g, "pytorch-eager") == {}
    by_layer = {i.layer: i for i in build_step(g, ort()).forward}
    assert by_layer["conv1"].attributes[layout_credits.LAYOUT_CREDIT] == 2 * 32 * 8 * 8
    eager_items = build_step(g, eager()).forward
    assert all(layout_credits.LAYOUT_CREDIT not in i.attributes for i in eager_items)


def test_grouped_conv_with_unaligned_channels_per_group_is_not_blocked() -> None:
    # 40 channels in 2 groups: 20 per group, not a multiple of the NCHWc block, so onnxruntime
    # runs conv2 in NCHW and conv1's output is reordered back in the model too.
    assert credits(conv_chain(40, 2), "onnxruntime") == {}
    assert set(credits(conv_chain(64, 2), "onnxruntime")) == {"conv1", "conv2"}
    assert set(credits(conv_chain(64, 4), "onnxruntime")) == set()  # 8 out
