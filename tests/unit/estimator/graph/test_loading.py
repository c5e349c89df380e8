"""graph: loading, binding, parameters and costs on tiny hand-built graphs."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator import graph
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import OpFamily

F = TensorProto.FLOAT


def weight(name: str, shape: list[int]) -> list[Any]:
    """(shape initializer, ConstantOfShape node): the structure-only weight convention."""
    return [helper.make_tensor(f"{name}__SHAPE", TensorProto.INT64, [len(shape)], shape),
            helper.make_node("ConstantOfShape", [f"{name}__SHAPE"], [name],
                             value=helper.make_tensor("value", F, [1], [0.0]))]


def model(nodes: list[Any], inputs: list[Any], outputs: list[Any],
          initializers: list[Any] = (), opset: int = 17, value_info: list[Any] = ()
          ) -> onnx.ModelProto:
    inits = [n for n in nodes if isinstance(n, onnx.TensorProto)] + list(initializers)
    ops = [n for n in nodes if isinstance(n, onnx.NodeProto)]
    g = helper.make_graph(ops, "tiny", inputs, outputs, initializer=inits,
                          value_info=list(value_info))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def small_cnn() -> onnx.ModelProto:
    """x[batch,3,8,8] → Conv(4,3x3,pad 1)+bias → BN → Relu → GAP → Flatten → Gemm(10)."""
    bn = [numpy_helper.from_array(np.ones(4, np.float32), f"bn.{k}")
          for k in ("scale", "bias", "mean", "var")]
    nodes = [
        *weight("conv.w", [4, 3, 3, 3]), *weight("conv.b", [4]), *weight("fc.w", [10, 4]),
        *weight("fc.b", [10]),
        helper.make_node("Conv", ["x", "conv.w", "conv.b"], ["c"], name="conv",
                         pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c", *(t.name for t in bn)], ["n"], name="bn"),
        helper.make_node("Relu", ["n"], ["r"], name="relu"),
        helper.make_node("GlobalAveragePool", ["r"], ["p"], name="gap"),
        helper.make_node("Flatten", ["p"], ["f"], name="flatten"),
        helper.make_node("Gemm", ["f", "fc.w", "fc.b"], ["y"], name="fc", transB=1),
    ]
    return model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 3, 8, 8])],
                 [helper.make_tensor_value_info("y", F, ["batch", 10])], bn)


def by_name(g: Any) -> dict[str, Any]:
    return {layer.name: layer for layer in g.layers}


def test_small_cnn_costs_and_parameters_by_hand(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "cnn.onnx"
    onnx.save(small_cnn(), path)
    g = graph.load_model(path, batch=2)
    layers = by_name(g)
    conv_out = 2 * 4 * 8 * 8
    assert layers["conv"].flops == 2 * conv_out * 3 * 9 + conv_out
    assert layers["conv"].bytes_read == 4 * (2 * 3 * 64 + 108 + 4)
    assert layers["conv"].bytes_written == 4 * conv_out
    assert layers["bn"].flops == conv_out * 8
    assert layers["relu"].flops == conv_out
    assert layers["gap"].flops == conv_out
    assert layers["fc"].flops == 2 * 2 * 4 * 10 + 2 * 10
    assert layers["flatten"].family is OpFamily.SHAPE_ONLY
    assert layers["flatten"].bytes_moved == 0
    # conv 108+4, BN scale+bias 8 (running mean/var are buffers), fc 40+10
    assert layers["conv"].parameter_count == 112
    assert layers["bn"].parameter_count == 8
    assert layers["bn"].parameter_inputs == ("bn.scale", "bn.bias")
    assert g.parameter_count == 170
    assert g.dim_bindings == {"batch": 2}
    assert g.unknown_op_types == ()
    assert [u.pattern for u in g.units] == ["conv_bn_act"]
    assert layers["conv"].unit == layers["relu"].unit != ""


def test_unbound_dim_is_named() -> None:
    data = small_cnn().SerializeToString()
    with pytest.raises(errors.UnboundDimError) as info:
        graph.load_model(data)
    assert info.value.dims == ("batch",)
    assert "batch" in str(info.value)


def test_named_dims_bind_and_leftovers_are_listed() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = model(nodes, [helper.make_tensor_value_info("x", F, ["batch", "sequence", "width"])],
              [helper.make_tensor_value_info("y", F, None)])
    with pytest.raises(errors.UnboundDimError) as info:
        graph.load_model(m.SerializeToString(), batch=3)
    assert info.value.dims == ("sequence", "width")
    g = graph.load_model(m.SerializeToString(), batch=3,
                         dim_bindings={"sequence": 5, "width": 7})
    assert g.layers[0].outputs[0].shape == (3, 5, 7)
    with pytest.raises(errors.InvalidRequestError, match="sequence"):
        graph.load_model(m.SerializeToString(), batch=3, dim_bindings={"sequence": 0,
                                                                       "width": 1})


def test_truncated_and_non_onnx_files_name_the_file(tmp_path: pathlib.Path) -> None:
    data = small_cnn().SerializeToString()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(errors.InvalidModelError, match=r"cut\.onnx"):
        graph.load_model(cut, batch=1)
    text = tmp_path / "notes.onnx"
    text.write_text("this is not a model\n")
    with pytest.raises(errors.InvalidModelError, match=r"notes\.onnx"):
        graph.load_model(text, batch=1)
    with pytest.raises(errors.InvalidModelError, match=r"missing\.onnx"):
        graph.load_model(tmp_path / "missing.onnx")


def test_opset_out_of_range() -> None:
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    m = model(nodes, [helper.make_tensor_value_info("x", F, [2])],
              [helper.make_tensor_value_info("y", F, [2])], opset=6)
    with pytest.raises(errors.UnsupportedOpsetError, match="opset 6"):
        graph.load_model(m.SerializeToString())


def full_model() -> onnx.ModelProto:
    """A model with real weights, as a user would export it."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 32)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(64).astype(np.float32), "b")
    shape = numpy_helper.from_array(np.array([-1, 8, 8], np.int64), "shape")
    nodes = [helper.make_node("Gemm", ["x", "w", "b"], ["h"], transB=1),
             helper.make_node("Reshape", ["h", "shape"], ["y"])]
    return model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 32])],
                 [helper.make_tensor_value_info("y", F, None)], [w, b, shape])


@pytest.mark.parametrize("compress", [None, "gzip", "xz", "zstd"])
def test_strip_weights_round_trip(tmp_path: pathlib.Path, compress: str | None) -> None:
    src, dst = tmp_path / "full.onnx", tmp_path / "light.onnx"
    onnx.save(full_model(), src)
    in_bytes, out_bytes = graph.strip_weights(src, dst, compress=compress)
    assert in_bytes == src.stat().st_size
    assert out_bytes == dst.stat().st_size < in_bytes
    assert graph.compression_of(dst.read_bytes()) == compress
    original, light = graph.load_model(src, batch=4), graph.load_model(dst, batch=4)
    assert light.parameter_count == original.parameter_count == 64 * 32 + 64
    assert [ly.flops for ly in light.layers if ly.family is not OpFamily.SHAPE_ONLY] == [
        ly.flops for ly in original.layers if ly.family is not OpFamily.SHAPE_ONLY]
    assert light.layers[-1].outputs[0].shape == (4, 8, 8)  # int64 shape tensor kept
    stripped = onnx.load_from_string(graph.read_model_bytes(dst))
    # b (64 elements) is under the 128-element threshold and stays, as in replace_constants
    assert {t.name for t in stripped.graph.initializer} == {"w__SHAPE", "b", "shape"}


def test_decompression_cap_and_corrupt_archive(tmp_path: pathlib.Path) -> None:
    src, dst = tmp_path / "full.onnx", tmp_path / "light.onnx.gz"
    onnx.save(full_model(), src)
    graph.strip_weights(src, dst, compress="gzip")
    with pytest.raises(errors.InvalidModelError, match="cap of 100 bytes"):
        graph.load_model(dst, batch=1, max_decompressed_bytes=100)
    data = dst.read_bytes()
    with pytest.raises(errors.InvalidModelError, match="truncated gzip"):
        graph.read_model_bytes(data[: len(data) // 2])
    with pytest.raises(errors.InvalidRequestError, match="compress"):
        graph.strip_weights(src, tmp_path / "x", compress="bz2")


def test_tied_embedding_counted_once() -> None:
    nodes = [*weight("emb", [100, 16]),
             helper.make_node("Gather", ["emb", "ids"], ["e"], name="embed"),
             helper.make_node("Transpose", ["emb"], ["emb_t"], name="emb_t", perm=[1, 0]),
             helper.make_node("MatMul", ["e", "emb_t"], ["logits"], name="head")]
    m = model(nodes, [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", 7])],
              [helper.make_tensor_value_info("logits", F, None)])
    g = graph.load_model(m.SerializeToString(), batch=2)
    layers = by_name(g)
    assert layers["embed"].family is OpFamily.EMBEDDING
    assert layers["emb_t"].family is OpFamily.SHAPE_ONLY  # W.t() is a view
    assert layers["embed"].parameter_inputs == layers["head"].parameter_inputs == ("emb",)
    assert (layers["embed"].parameter_count, layers["head"].parameter_count) == (1600, 0)
    assert g.parameter_count == 1600
    assert layers["head"].flops == 2 * 14 * 16 * 100


def test_weights_declared_as_static_graph_inputs() -> None:
    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], name="conv")]
    m = model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 3, 5, 5]),
                      helper.make_tensor_value_info("w", F, [2, 3, 1, 1])],
              [helper.make_tensor_value_info("y", F, None)])
    g = graph.load_model(m.SerializeToString(), batch=1)
    assert g.layers[0].parameter_inputs == ("w",)
    assert g.parameter_count == 6


def test_shape_computations_cost_nothing() -> None:
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape"),
             helper.make_node("Gather", ["s", "zero"], ["n"], name="first", axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["n1"], name="unsq"),
             helper.make_node("Concat", ["n1", "minus1"], ["target"], name="cat", axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape")]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [], [0]),
             helper.make_tensor("axes", TensorProto.INT64, [1], [0]),
             helper.make_tensor("minus1", TensorProto.INT64, [1], [-1])]
    m = model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 3, 4])],
              [helper.make_tensor_value_info("y", F, None)], inits)
    g = graph.load_model(m.SerializeToString(), batch=5)
    assert {ly.family for ly in g.layers} == {OpFamily.SHAPE_ONLY}
    assert sum(ly.bytes_moved + ly.flops for ly in g.layers) == 0
    assert g.layers[-1].outputs[0].shape == (5, 12)


def test_control_flow_and_unknown_ops_are_other_and_listed() -> None:
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["bx"])], "b", [],
                               [helper.make_tensor_value_info("bx", F, ["batch", 4])])
    nodes = [helper.make_node("If", ["cond"], ["i"], name="if", then_branch=branch,
                              else_branch=branch),
             helper.make_node("Foo", ["i"], ["f"], name="foo", domain="com.example"),
             helper.make_node("Relu", ["f"], ["y"], name="relu")]
    m = model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 4]),
                      helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
              [helper.make_tensor_value_info("y", F, None)],
              value_info=[helper.make_tensor_value_info("f", F, ["batch", 4])])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    g = graph.load_model(m.SerializeToString(), batch=2)
    layers = by_name(g)
    assert layers["if"].family is OpFamily.OTHER
    assert layers["foo"].family is OpFamily.OTHER
    assert g.unknown_op_types == ("Foo", "If")
    assert layers["relu"].outputs[0].shape == (2, 4)


def test_unresolvable_shape_names_node_and_tensor() -> None:
    nodes = [helper.make_node("Foo", ["x"], ["f"], name="foo", domain="com.example"),
             helper.make_node("Relu", ["f"], ["y"], name="relu")]
    m = model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 4])],
              [helper.make_tensor_value_info("y", F, None)])
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    with pytest.raises(errors.InvalidModelError, match=r"'foo'.*'f'"):
        graph.load_model(m.SerializeToString(), batch=2)
