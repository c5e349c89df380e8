"""graph_layers: the pure record → layers step, incl. the fallback shape propagation."""

from __future__ import annotations

import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import OpFamily, TensorInfo
from gpuplan_estimator.graph import records
from gpuplan_estimator.graph.records import GraphRecord, NodeRecord


def record(nodes: list[NodeRecord], tensors: list[TensorInfo]) -> GraphRecord:
    return GraphRecord(nodes=tuple(nodes), tensors={t.name: t for t in tensors},
                       initializers=frozenset({"b"}), data_inputs=frozenset({"x"}),
                       graph_outputs=frozenset({"z"}), symbolic_inputs=frozenset({"x"}))


def test_missing_shapes_are_propagated_for_elementwise_ops() -> None:
    nodes = [NodeRecord("relu", "Relu", ("x",), ("y",), {}),
             NodeRecord("add", "Add", ("y", "b"), ("z",), {})]
    tensors = [TensorInfo("x", (2, 3), "float32"), TensorInfo("b", (3,), "float32")]
    layers, unknown = records.build_layers(record(nodes, tensors), opset=17, label="m")
    assert [ly.outputs[0].shape for ly in layers] == [(2, 3), (2, 3)]
    assert layers[1].parameter_inputs == ("b",) and layers[1].parameter_count == 3
    assert unknown == ()


def test_unresolvable_shape_is_an_error_not_zero() -> None:
    nodes = [NodeRecord("mm", "MatMul", ("x", "x"), ("z",), {})]
    with pytest.raises(errors.InvalidModelError, match="'mm'"):
        records.build_layers(record(nodes, [TensorInfo("x", (2, 2), "float32")]),
                                  opset=17, label="m")


def test_unused_optional_output_without_shape_is_dropped() -> None:
    nodes = [NodeRecord("drop", "Dropout", ("x",), ("z", "mask"), {})]
    tensors = [TensorInfo("x", (4,), "float32"), TensorInfo("z", (4,), "float32")]
    layers, _ = records.build_layers(record(nodes, tensors), opset=17, label="m")
    assert [t.name for t in layers[0].outputs] == ["z"]
    assert layers[0].family is OpFamily.ELEMENTWISE
