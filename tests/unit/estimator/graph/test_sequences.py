"""Sequence ops (torch.onnx dynamo's split/cat): shapes resolved from their constants."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from gpuplan_estimator import graph
from gpuplan_estimator.core.errors import InvalidModelError
from gpuplan_estimator.core.layers import OpFamily


def qkv_split_model(split: list[int] | None, *, constant_split: bool = True) -> bytes:
    """x[batch, 16, 24] → SplitToSequence on the last axis → SequenceAt 0..2 → Add → Concat."""
    nodes = []
    inits = [numpy_helper.from_array(np.array(i, np.int64), f"p{i}") for i in range(3)]
    split_input = ""
    if split is not None:
        value = numpy_helper.from_array(np.array(split, np.int64), "split")
        if constant_split:
            inits.append(value)
        split_input = "split"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16, 24])]
    if split is not None and not constant_split:
        inputs.append(helper.make_tensor_value_info("split", TensorProto.INT64, [3]))
    nodes.append(helper.make_node("SplitToSequence", ["x", split_input] if split_input
                                  else ["x"], ["seq"], axis=2))
    nodes += [helper.make_node("SequenceAt", ["seq", f"p{i}"], [f"t{i}"]) for i in range(3)]
    nodes.append(helper.make_node("Add", ["t0", "t1"], ["s"]))
    nodes.append(helper.make_node("SequenceConstruct", ["s", "t2"], ["pair"]))
    nodes.append(helper.make_node("ConcatFromSequence", ["pair"], ["y"], axis=2))
    g = helper.make_graph(nodes, "qkv", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


def test_split_to_sequence_and_back_get_concrete_shapes() -> None:
    g = graph.load_model(qkv_split_model([8, 8, 8]), batch=2)
    by_op = {layer.op_type: layer for layer in g.layers}
    assert [t.shape for t in by_op["SplitToSequence"].outputs] == [(2, 16, 8)] * 3
    assert by_op["SplitToSequence"].family is OpFamily.DATA_MOVEMENT
    assert by_op["Add"].outputs[0].shape == (2, 16, 8)
    assert by_op["ConcatFromSequence"].outputs[0].shape == (2, 16, 16)
    assert not g.unknown_op_types


def test_scalar_split_makes_equal_chunks_with_a_smaller_last_one() -> None:
    g = graph.load_model(qkv_split_model([10]), batch=1)
    split = next(layer for layer in g.layers if layer.op_type == "SplitToSequence")
    assert [t.shape[2] for t in split.outputs] == [10, 10, 4]


def test_split_without_sizes_makes_size_one_slices() -> None:
    model = onnx.load_from_string(qkv_split_model(None))
    # 24 slices of size 1 along the axis, kept there (keepdims defaults to 1)
    g = graph.load_model(model.SerializeToString(), batch=1)
    split = next(layer for layer in g.layers if layer.op_type == "SplitToSequence")
    assert len(split.outputs) == 24 and split.outputs[0].shape == (1, 16, 1)


def test_split_sizes_that_are_not_a_constant_are_named() -> None:
    with pytest.raises(InvalidModelError, match=r"SplitToSequence.*split 'split' is not a "
                                                r"constant"):
        graph.load_model(qkv_split_model([8, 8, 8], constant_split=False), batch=1)


def test_split_sizes_must_add_up() -> None:
    with pytest.raises(InvalidModelError, match=r"do not add up"):
        graph.load_model(qkv_split_model([8, 8, 9]), batch=1)


def test_a_training_step_prices_the_split_and_its_gradient() -> None:
    from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, load_catalog

    g = graph.load_model(qkv_split_model([8, 8, 8]), batch=2)
    (result,) = estimate(g, [load_catalog().resolve("t4")], TrainingSettings(batch_size=2),
                         predictor=RooflinePredictor())
    assert result.step_time_ms > 0
