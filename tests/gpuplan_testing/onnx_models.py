"""Tiny ONNX models that tests build in memory (no weights files committed)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def batch_folded_model() -> onnx.ModelProto:
    """x[1, 3, 8, 8] → Conv → Reshape([192·4]): a head that folds the batch into one dim, so
    the model cannot be re-batched (its constants keep batch 1)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3, 3, 3], np.zeros(108, np.float32))
    shape = numpy_helper.from_array(np.array([256], np.int64), "shape")
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Reshape", ["c", "shape"], ["y"])]
    g = helper.make_graph(
        nodes, "folded", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [256])], [w, shape])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
