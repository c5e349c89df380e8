"""Shape values the exporters compute in-graph are folded, so what follows them has shapes."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator import graph
from gpuplan_estimator.core.errors import InvalidModelError
from gpuplan_estimator.core.layers import OpFamily


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None,
           opset: int = 18) -> bytes:
    g = helper.make_graph(nodes, "folding", inputs, outputs, inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=9).SerializeToString()


def _weight(name: str, dims: list[int]) -> tuple[object, object]:
    """A stripped weight: ConstantOfShape of a literal shape."""
    shape = numpy_helper.from_array(np.array(dims, np.int64), f"{name}__SHAPE")
    node = helper.make_node("ConstantOfShape", [shape.name], [name],
                            value=helper.make_tensor("value", TensorProto.FLOAT, [1], [0]))
    return shape, node


def conv_with_synthesised_bias() -> bytes:
    """What torch.onnx's dynamo exporter writes for a conv without bias: a zero bias built as
    Expand(0, Shape(W)[0:1]) — onnx's inference leaves its shape open."""
    shape, weight = _weight("w", [4, 3, 3, 3])
    nodes = [
        weight,
        helper.make_node("Shape", ["w"], ["cout"], start=0, end=1),
        helper.make_node("Constant", [], ["zero"], value_float=0.0),
        helper.make_node("Expand", ["zero", "cout"], ["bias"]),
        helper.make_node("Conv", ["x", "w", "bias"], ["y"], pads=[1, 1, 1, 1]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [shape])


def test_a_bias_expanded_from_a_computed_shape_gets_its_shape() -> None:
    g = graph.load_model(conv_with_synthesised_bias())
    conv = next(layer for layer in g.layers if layer.op_type == "Conv")
    assert [t.shape for t in conv.inputs] == [(2, 3, 8, 8), (4, 3, 3, 3), (4,)]
    assert conv.outputs[0].shape == (2, 4, 8, 8)
    assert g.parameter_count == 4 * 3 * 3 * 3  # the synthesised zero bias is not a weight


def causal_mask_model(sequence: int) -> bytes:
    """x[1, S, 8] + a mask built as ConstantOfShape(Concat(Shape(x)[1:2], Shape(x)[1:2]))."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"], start=1, end=2),
        helper.make_node("Concat", ["s", "s"], ["ss"], axis=0),
        helper.make_node("ConstantOfShape", ["ss"], ["mask"],
                         value=helper.make_tensor("value", TensorProto.FLOAT, [1], [-1e9])),
        helper.make_node("Unsqueeze", ["mask", "axes"], ["mask3"]),
        helper.make_node("MatMul", ["x", "xt"], ["scores"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("Add", ["scores", "mask3"], ["y"]),
    ]
    nodes = [nodes[0], nodes[1], nodes[2], nodes[3], nodes[5], nodes[4], nodes[6]]
    axes = numpy_helper.from_array(np.array([0], np.int64), "axes")
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, sequence, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [axes])


def test_a_mask_built_from_folded_shapes_is_data_not_a_weight() -> None:
    g = graph.load_model(causal_mask_model(16))
    assert g.parameter_count == 0
    add = next(layer for layer in g.layers if layer.op_type == "Add")
    assert add.outputs[0].shape == (1, 16, 16)


def constant_if_model(condition: bool | None) -> bytes:
    """y = If(cond) then Relu(x) else Sigmoid(x); cond a Constant, or a graph input (None)."""
    then_branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"])], "then", [],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, [2, 8])])
    else_branch = helper.make_graph(
        [helper.make_node("Sigmoid", ["x"], ["s"])], "else", [],
        [helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 8])])
    nodes = []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])]
    if condition is None:
        inputs.append(helper.make_tensor_value_info("cond", TensorProto.BOOL, []))
    else:
        nodes.append(helper.make_node("Constant", [], ["cond"], value=numpy_helper.from_array(
            np.array(condition), "cond")))
    nodes.append(helper.make_node("If", ["cond"], ["z"], then_branch=then_branch,
                                  else_branch=else_branch, name="branch"))
    nodes.append(helper.make_node("Add", ["z", "x"], ["y"]))
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


@pytest.mark.parametrize(("condition", "taken"), [(True, "Relu"), (False, "Sigmoid")])
def test_an_if_with_a_constant_condition_is_the_branch_it_takes(condition: bool,
                                                                taken: str) -> None:
    g = graph.load_model(constant_if_model(condition))
    ops = [layer.op_type for layer in g.layers if layer.family is not OpFamily.SHAPE_ONLY]
    assert ops == [taken, "Add"]
    assert g.unknown_op_types == ()


def test_an_if_on_data_stays_listed_as_uncovered() -> None:
    g = graph.load_model(constant_if_model(None))
    assert g.unknown_op_types == ("If",)


def test_a_huge_computed_range_is_not_materialised() -> None:
    """A hostile Range(0, 2^40) is left alone (it would need 8 TB), and what needs its
    shape is named."""
    limit = numpy_helper.from_array(np.array(2**40, np.int64), "limit")
    zero = numpy_helper.from_array(np.array(0, np.int64), "zero")
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    nodes = [helper.make_node("Range", ["zero", "limit", "one"], ["r"]),
             helper.make_node("Cast", ["r"], ["rf"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["rf", "x"], ["y"])]
    data = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                  [limit, zero, one])
    with pytest.raises(InvalidModelError, match=r"\(Range\) would hold 1099511627776 elements"):
        graph.load_model(data)


def test_an_annotation_the_graph_contradicts_is_dropped_not_fatal() -> None:
    """An optimizer pass that left a stale value_info (here: a [4] tensor annotated as a
    scalar) would make onnx's inference fail; the graph alone decides."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Neg", ["r"], ["y"])]
    g = helper.make_graph(nodes, "stale", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                        [4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          value_info=[helper.make_tensor_value_info("r", TensorProto.FLOAT, [])])
    data = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)],
                             ir_version=9).SerializeToString()
    loaded = graph.load_model(data)
    assert [t.shape for layer in loaded.layers for t in layer.outputs] == [(4,), (4,)]


def loop_model(trips: int, *, condition: str = "pass") -> bytes:
    """x[2, 4] → Loop(trips): y = x·W, x ← Relu(y), scan out y: a recurrent cell unrolled
    by TorchScript-style exports. `condition`: the body passes the condition through
    ("pass"), or computes it from data ("data")."""
    body_nodes = [helper.make_node("MatMul", ["x_in", "w"], ["y"]),
                  helper.make_node("Relu", ["y"], ["x_out"])]
    if condition == "data":
        body_nodes += [helper.make_node("ReduceSum", ["y"], ["total"], keepdims=0),
                       helper.make_node("Constant", [], ["zero"], value_float=0.0),
                       helper.make_node("Greater", ["total", "zero"], ["cond_out"])]
    else:
        body_nodes.append(helper.make_node("Identity", ["cond_in"], ["cond_out"]))
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [2, 4]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
    shape, weight = _weight("w", [4, 4])
    trip = numpy_helper.from_array(np.array(trips, np.int64), "trips")
    cond = numpy_helper.from_array(np.array(True), "cond")
    nodes = [weight, helper.make_node("Loop", ["trips", "cond", "x"], ["final", "y"],
                                      body=body, name="cell"),
             helper.make_node("Add", ["x", "x"] if condition == "data" else ["final", "final"],
                              ["z"])]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                  [helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
                   helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                  [shape, trip, cond])


def test_a_loop_of_static_trip_count_is_its_body_once_per_iteration() -> None:
    data = loop_model(3)
    g = graph.load_model(data)
    matmuls = [layer for layer in g.layers if layer.op_type == "MatMul"]
    assert [layer.name for layer in matmuls] == [f"cell/iter{i}/MatMul" for i in range(3)]
    assert sum(layer.flops for layer in matmuls) == 3 * 2 * 2 * 4 * 4
    assert g.parameter_count == 16  # the outer weight, read by every iteration, counted once
    assert g.unknown_op_types == ()
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    z, y = session.run(["z", "y"], {"x": np.ones((2, 4), np.float32)})
    shapes = {t.name: t.shape for layer in g.layers for t in layer.outputs}
    assert (shapes["z"], shapes["y"]) == (z.shape, y.shape) == ((2, 4), (3, 2, 4))


def test_a_loop_that_can_end_early_stays_listed() -> None:
    """Its trip count is not static: it stays one uncovered node (onnx gives its outputs no
    shape, so only a graph that does not compute on them estimates)."""
    g = graph.load_model(loop_model(3, condition="data"))
    assert g.unknown_op_types == ("Loop",)
    assert not any(layer.op_type == "MatMul" for layer in g.layers)


def scale_like_scores_model() -> bytes:
    """What torch.onnx's dynamo exporter writes for SDPA's scale: 1/sqrt(CastLike(head_dim,
    scores)) from a folded shape, the scores being data."""
    nodes = [
        helper.make_node("Shape", ["q"], ["d"], start=-1),
        helper.make_node("Cast", ["d"], ["df"], to=TensorProto.FLOAT),
        helper.make_node("CastLike", ["df", "q"], ["dl"]),
        helper.make_node("Sqrt", ["dl"], ["root"]),
        helper.make_node("Div", ["q", "root"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("q", TensorProto.FLOAT, [2, 4, 16])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])


def test_a_scale_cast_like_the_scores_folds_to_a_constant() -> None:
    # Eager PyTorch computes such a scale in Python and launches nothing for it.
    g = graph.load_model(scale_like_scores_model())
    ops = [layer.op_type for layer in g.layers]
    assert "CastLike" not in ops and "Sqrt" not in ops
    assert ops.count("Div") == 1
    session = ort.InferenceSession(scale_like_scores_model(), providers=["CPUExecutionProvider"])
    q = np.full((2, 4, 16), 8.0, np.float32)
    np.testing.assert_allclose(session.run(None, {"q": q})[0], 2.0)  # the model folded is valid
