"""The batch of a model: which batch a graph runs at, and re-batching fixed-batch exports."""

from __future__ import annotations

from onnx import numpy_helper

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import FLOAT_DTYPES, ModelGraph, OpFamily
from gpuplan_estimator.graph import loading


def model_batch(g: ModelGraph, requested: int | None) -> int:
    """The batch the graph was built at: `requested` when it bound a dim, else the graph's own.

    A model with a fixed batch is not re-batched here (`symbolic_batch` does that); saying so beats estimating a
    different batch than the one asked for.
    """
    first = _first_data_dim(g)
    if requested is None:
        if first is None:
            raise InvalidRequestError("batch", "cannot tell the model's batch; give the batch size")
        return first
    if first is not None and first != requested:
        raise InvalidRequestError(
            "batch", f"the model has a fixed batch of {first}; it cannot run at {requested}")
    return requested


def _first_data_dim(g: ModelGraph) -> int | None:
    produced = {t.name for layer in g.layers for t in layer.outputs}
    params = {name for layer in g.layers for name in layer.parameter_inputs}
    for layer in g.layers:
        for t in layer.inputs:
            if (t.name not in produced and t.name not in params and t.shape
                    and t.dtype in FLOAT_DTYPES | {"int64", "int32"}
                    and layer.family is not OpFamily.SHAPE_ONLY):
                return t.shape[0]
    return None


def symbolic_batch(data: bytes) -> bytes:
    """Make a fixed-batch model's leading input dim symbolic (``batch``).

    Reshape targets that hard-code the batch in their first entry get 0 there, ONNX's "copy
    this dim from the input". The planner uses it to estimate a model exported at batch 1 at
    the per-GPU batches it considers.
    """
    model = loading.parse_model(data, "<model>")
    initializers = {t.name: t for t in model.graph.initializer}
    fixed = set()
    for value in model.graph.input:
        if value.name in initializers:
            continue
        dim = value.type.tensor_type.shape.dim[0]
        if dim.HasField("dim_value"):
            fixed.add(dim.dim_value)
        dim.dim_param = "batch"
    for node in model.graph.node:
        target = initializers.get(node.input[1]) if node.op_type == "Reshape" else None
        if target is not None:
            shape = numpy_helper.to_array(target).copy()
            if shape.size and int(shape[0]) in fixed:
                shape[0] = 0
                target.CopyFrom(numpy_helper.from_array(shape, target.name))
    return model.SerializeToString()
