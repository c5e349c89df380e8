"""The batch of a model: which batch a graph runs at, and re-batching fixed-batch exports."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from gpuplan_estimator.core.errors import GpuplanError, InvalidModelError, InvalidRequestError
from gpuplan_estimator.core.layers import FLOAT_DTYPES, ModelGraph, OpFamily
from gpuplan_estimator.graph import loading

DATA_DTYPES = FLOAT_DTYPES | {"int64", "int32"}
"""Dtypes of tensors a model is fed (token ids, images, features), not masks of bool."""


def model_batch(g: ModelGraph, requested: int | None) -> int:
    """The batch the graph was built at: `requested` when it bound a dim, else the graph's own.

    A model with a fixed batch is not re-batched here (`load_at_batch` does that); saying so
    beats estimating a different batch than the one asked for.
    """
    own = graph_batch(g)
    if requested is None:
        if own is None:
            raise InvalidRequestError("batch", "cannot tell the model's batch; give the batch size")
        return own
    if own is not None and own != requested:
        raise InvalidRequestError(
            "batch", f"the model has a fixed batch of {own}; it cannot run at {requested}")
    return requested


def graph_batch(g: ModelGraph) -> int | None:
    """The graph's own batch: the leading dim its data inputs share.

    Data inputs are the integer and float tensors the graph is fed (not parameters). When
    they disagree, the batch is that of the first one a compute layer reads (a mask or a
    position table may lead with another dim). None for a graph without data inputs.
    """
    produced = {t.name for layer in g.layers for t in layer.outputs}
    params = {name for layer in g.layers for name in layer.parameter_inputs}
    leading: dict[str, int] = {}
    first_computed: int | None = None
    for layer in g.layers:
        for t in layer.inputs:
            if (t.name in produced or t.name in params or not t.shape
                    or t.dtype not in DATA_DTYPES):
                continue
            leading.setdefault(t.name, t.shape[0])
            if first_computed is None and layer.family is not OpFamily.SHAPE_ONLY:
                first_computed = t.shape[0]
    common = set(leading.values())
    if len(common) == 1:
        return common.pop()
    return first_computed


def load_at_batch(source: loading.Source, batch: int | None, dims: Mapping[str, int],
                  *, name: str | None = None) -> ModelGraph:
    """The model at `batch`, re-batching a fixed-batch export the way the planner does.

    The rule: the leading dim of every data input (and of outputs and constant Reshape
    targets that repeat the exported batch) is the batch (`symbolic_batch`). A model whose
    batch cannot be freed that way is refused with the batch it was exported at.
    """
    g = loading.load_model(source, batch=batch, dim_bindings=dims, name=name)
    own = graph_batch(g)
    if batch is None or own is None or own == batch:
        return g
    data = loading.read_model_bytes(source)
    try:
        freed = loading.load_model(symbolic_batch(data), batch=batch, dim_bindings=dims,
                                   name=name or g.name)
    except GpuplanError as exc:
        raise InvalidRequestError(
            "batch", f"the model has a fixed batch of {own} and re-batching it to {batch} "
            f"failed: {exc}") from exc
    if graph_batch(freed) != batch:
        raise InvalidRequestError(
            "batch", f"the model has a fixed batch of {own} that its constants keep; it "
            f"cannot run at {batch}")
    return freed


def symbolic_batch(data: bytes) -> bytes:
    """Make a fixed-batch model's leading input dim symbolic (``batch``).

    Reshape targets that hard-code the batch in their first entry get 0 there, ONNX's "copy
    this dim from the input". The planner uses it to estimate a model exported at batch 1 at
    the per-GPU batches it considers.
    """
    model = loading.parse_model(data, "<model>")
    _set_batch(model, None)
    return model.SerializeToString()


def fixed_batch(model: onnx.ModelProto, batch: int) -> onnx.ModelProto:
    """A copy of a fixed-batch model at another fixed `batch` (to run it, not only to price it).

    Reshape targets whose leading entry is the exported batch get `batch` there; the result is
    checked by shape inference, so a target that was not batch-major fails loudly.
    """
    if batch < 1:
        raise InvalidRequestError("batch", f"must be positive, got {batch}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    _set_batch(out, batch)
    onnx.shape_inference.infer_shapes(out, check_type=True, strict_mode=True)
    return out


def _free_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    produced = {o for n in model.graph.node for o in n.output}
    inits = {i.name for i in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in produced and i.name not in inits]


def _set_leading(dim: onnx.TensorShapeProto.Dimension, batch: int | None) -> None:
    if batch is None:
        dim.dim_param = "batch"
    else:
        dim.dim_value = batch


def _set_batch(model: onnx.ModelProto, batch: int | None) -> None:
    """Leading dim of the free inputs (and of outputs and Reshape targets at the exported
    batch) set to `batch`, or made symbolic when `batch` is None; in place."""
    exported: set[int] = set()
    for value in _free_inputs(model):
        dims = value.type.tensor_type.shape.dim
        if not dims:
            if batch is None:
                continue  # a scalar input has no batch to free
            raise InvalidModelError(f"{model.graph.name}: input {value.name} has no batch dim")
        if dims[0].HasField("dim_value"):
            exported.add(dims[0].dim_value)
        _set_leading(dims[0], batch)
    del model.graph.value_info[:]  # stale shapes at the exported batch; re-inferred later
    for value in model.graph.output:
        dims = value.type.tensor_type.shape.dim
        if dims and dims[0].HasField("dim_value") and dims[0].dim_value in exported:
            _set_leading(dims[0], batch)
    initializers = {t.name: t for t in model.graph.initializer}
    for node in model.graph.node:
        target = initializers.get(node.input[1]) if node.op_type == "Reshape" else None
        if target is None:
            continue
        shape = numpy_helper.to_array(target).copy()
        if shape.size and int(shape[0]) in exported:
            shape[0] = 0 if batch is None else batch
            target.CopyFrom(numpy_helper.from_array(shape.astype(np.int64), target.name))
