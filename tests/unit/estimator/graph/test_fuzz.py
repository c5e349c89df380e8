"""A slice of `make fuzz` (10^5 mutated graphs), plus the inputs earlier campaigns found."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from campaigns import fuzz_graphs


def test_a_slice_of_the_campaign_ends_in_estimates_or_clear_errors() -> None:
    counts, crashers, _, _ = fuzz_graphs.campaign(600, random_state=7, per_input_s=20,
                                                   huge_chain=250_000)
    assert [c.detail for _, c in crashers] == []
    assert counts["ok"] > 0 and counts["error"] > 0 and counts["crash"] == 0
    assert sum(counts.values()) == 600


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto] | None = None) -> bytes:
    g = helper.make_graph(nodes, "found", inputs,
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=8).SerializeToString()


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 8, 8])
W = numpy_helper.from_array(np.zeros((4, 3, 3, 3), np.float32), "w")

FOUND = {
    # SIGFPE inside onnx's C++ shape inference: a zero stride was a division by zero.
    "zero stride": _model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2],
                                            strides=[0, 0])], [X]),
    "negative dilation": _model([helper.make_node("Conv", ["x", "w"], ["y"],
                                                  dilations=[-1, 1])], [X], [W]),
    # int64 initializer whose data does not fill its dims (numpy reshape ValueError).
    "short constant": _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])], [X],
        [helper.make_tensor("shape", TensorProto.INT64, [0, 2], [2, -1], raw=False)]),
    # a pool without kernel_shape, and a softmax whose axis is not an int
    "pool without kernel": _model([helper.make_node("MaxPool", ["x"], ["y"])], [X]),
    "sequence position out of range": _model(
        [helper.make_node("SplitToSequence", ["x"], ["s"], axis=1),
         helper.make_node("SequenceAt", ["s", "p"], ["y"])], [X],
        [numpy_helper.from_array(np.array(7, np.int64), "p")]),
    # SIGSEGV inside onnx's C++ shape inference: four pads for a rank-2 input.
    "pads longer than the input's spatial dims": _model(
        [helper.make_node("Conv", ["v", "w"], ["y"], pads=[1, 1, 1, 1])],
        [helper.make_tensor_value_info("v", TensorProto.FLOAT, [2, 8])], [W]),
    # MemoryError: a split into size-1 pieces along a dim of 2^40.
    "split into 2^40 pieces": _model(
        [helper.make_node("SplitToSequence", ["big"], ["s"], axis=1),
         helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=1)],
        [helper.make_tensor_value_info("big", TensorProto.FLOAT, [1, 2**40])]),
    # an axis attribute that holds a list (TypeError in int())
    "list-valued axis": _model(
        [helper.make_node("SplitToSequence", ["x"], ["s"], axis=[1, 2]),
         helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=1)], [X]),
    # a position constant with no value (an unpacking ValueError)
    "empty position": _model(
        [helper.make_node("SplitToSequence", ["x"], ["s"], axis=1),
         helper.make_node("SequenceAt", ["s", "p"], ["y"])], [X],
        [numpy_helper.from_array(np.zeros((0,), np.int64), "p")]),
    "SequenceAt without a position": _model(
        [helper.make_node("SplitToSequence", ["x"], ["s"], axis=1),
         helper.make_node("SequenceAt", ["s"], ["y"])], [X]),
}


@pytest.mark.parametrize("name", sorted(FOUND))
def test_inputs_earlier_campaigns_crashed_on_are_clear_errors(name: str) -> None:
    outcome = fuzz_graphs.run_one(FOUND[name], per_input_s=20)
    assert outcome.kind == "error", outcome.detail
