"""Batch of a graph: the batch it runs at, and re-batching fixed-batch exports."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator import graph
from gpuplan_estimator.core.errors import InvalidModelError, InvalidRequestError
from gpuplan_estimator.graph import batching


def batch1_model(*, scalar_input: bool = False) -> onnx.ModelProto:
    """Conv → Reshape([1, -1]) exported at batch 1, like a light model's classifier head."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.zeros(108, np.float32))
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    if scalar_input:
        inputs.append(helper.make_tensor_value_info("scale", TensorProto.FLOAT, []))
    g = helper.make_graph(nodes, "tiny", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256])],
                          [w, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_fixed_batch_rewrites_input_output_and_reshape() -> None:
    out = batching.fixed_batch(batch1_model(), 8)
    assert out.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 8
    assert out.graph.output[0].type.tensor_type.shape.dim[0].dim_value == 8
    shape = next(t for t in out.graph.initializer if t.name == "shape")
    assert numpy_helper.to_array(shape).tolist() == [8, -1]
    with pytest.raises(InvalidRequestError, match="batch"):
        batching.fixed_batch(batch1_model(), 0)


def test_fixed_batch_refuses_an_input_without_a_batch_dim() -> None:
    with pytest.raises(InvalidModelError, match="scale"):
        batching.fixed_batch(batch1_model(scalar_input=True), 4)


@pytest.mark.parametrize("scalar_input", [False, True])
def test_symbolic_batch_loads_at_any_batch(scalar_input: bool) -> None:
    data = batching.symbolic_batch(batch1_model(scalar_input=scalar_input).SerializeToString())
    model = onnx.load_from_string(data)
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "batch"
    shape = next(t for t in model.graph.initializer if t.name == "shape")
    assert numpy_helper.to_array(shape).tolist() == [0, -1]  # 0: copy the input's batch
    g = graph.load_model(data, batch=4)
    assert graph.model_batch(g, None) == 4
    assert g.layers[-1].outputs[0].shape == (4, 256)


def test_model_batch_names_the_field_not_a_flag() -> None:
    g = graph.load_model(batch1_model().SerializeToString())
    assert graph.model_batch(g, None) == 1
    assert graph.model_batch(g, 1) == 1
    with pytest.raises(InvalidRequestError, match=r"^batch: the model has a fixed batch of 1"):
        graph.model_batch(g, 32)


def test_a_graph_with_an_impossible_tensor_is_a_clear_error() -> None:
    """Dims whose product overflows int64 used to end in an OverflowError traceback."""
    huge = 2**31
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [huge, huge, huge])
    g = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "huge", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    with pytest.raises(InvalidModelError, match=r"'x' has shape .*beyond any real model"):
        graph.load_model(model.SerializeToString())


def dynamo_style_head(batch: int = 2) -> bytes:
    """Conv → Reshape(Concat(Constant [batch], Constant [-1])) with allowzero=1, the way
    torch.onnx's dynamo exporter writes `x.view(x.size(0), -1)` at a static batch."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.zeros(108, np.float32))
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Constant", [], ["lead"], value_ints=[batch]),
             helper.make_node("Constant", [], ["rest"], value_ints=[-1]),
             helper.make_node("Concat", ["lead", "rest"], ["target"], axis=0),
             helper.make_node("Reshape", ["c", "target"], ["y"], allowzero=1)]
    g = helper.make_graph(nodes, "head",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 256])],
                          [w])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)],
                             ir_version=9).SerializeToString()


def test_a_batch_in_a_concatenated_reshape_target_is_rebatched() -> None:
    g = graph.load_at_batch(dynamo_style_head(), 8, {})
    reshape = next(layer for layer in g.layers if layer.op_type == "Reshape")
    assert reshape.outputs[0].shape == (8, 256)
    assert graph.graph_batch(g) == 8


def token_model(*, position_table: bool) -> bytes:
    """ids[2, 16] → embedding → Reshape([2, 16, 4, 16]) (+ a [1, 16, 4, 16] constant
    position table when `position_table`): a decoder's head split at a fixed sequence."""
    emb = helper.make_tensor("emb", TensorProto.FLOAT, [100, 64], np.zeros(6400, np.float32))
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]),
             helper.make_node("Constant", [], ["heads"], value_ints=[2, 16, 4, 16]),
             helper.make_node("Reshape", ["e", "heads"], ["y"])]
    inits = [emb]
    if position_table:
        inits.append(helper.make_tensor("pos", TensorProto.FLOAT, [1, 16, 4, 16],
                                        np.zeros(1024, np.float32)))
        nodes[-1].output[0] = "h"
        nodes.append(helper.make_node("Add", ["h", "pos"], ["y"]))
    g = helper.make_graph(nodes, "tokens",
                          [helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 16])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)],
                             ir_version=9).SerializeToString()


def test_a_fixed_sequence_is_rebound_by_dim_sequence() -> None:
    g = graph.load_at_batch(token_model(position_table=False), 4, {"sequence": 32})
    reshape = next(layer for layer in g.layers if layer.op_type == "Reshape")
    assert reshape.outputs[0].shape == (4, 32, 4, 16)


def test_a_sequence_the_constants_keep_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequestError, match=r"dim_bindings.sequence: the model has a "
                       r"fixed sequence of 16 and re-sequencing it to 32 failed"):
        graph.load_at_batch(token_model(position_table=True), 2, {"sequence": 32})


def test_a_dim_the_graph_does_not_have_is_named() -> None:
    with pytest.raises(InvalidRequestError, match=r"dim_bindings.seq_len: the model has no "
                       r"symbolic dim 'seq_len'"):
        graph.load_at_batch(token_model(position_table=False), 2, {"seq_len": 32})
