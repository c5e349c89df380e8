"""The batch of a model: which batch a graph runs at, and re-batching fixed-batch exports."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from gpuplan_estimator.core.errors import GpuplanError, InvalidModelError, InvalidRequestError
from gpuplan_estimator.core.layers import FLOAT_DTYPES, ModelGraph, OpFamily
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
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
        if layer.op_type == "ConstantOfShape":
            continue  # its input is a shape (a stripped weight's), never data
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
    """The model at `batch` and `dims`, re-batching and re-sequencing a fixed export.

    The rules: the leading dim of every data input (and of outputs and of constant Reshape
    and Expand targets that repeat the exported batch) is the batch; axis 1 of every integer
    input (token ids), and entry 1 of constant Reshape and Expand targets that repeat the
    exported length, is the sequence, bound by ``dims["sequence"]`` when the graph has no
    symbolic dim of that name. A model whose constants keep the exported size is refused,
    naming it.
    """
    label = loading.source_label(source)
    g = loading.load_model(source, batch=batch, dim_bindings=dims, name=name)
    unused = sorted(set(dims) - set(g.dim_bindings))
    for key in unused:
        if key != SEQUENCE_DIM:
            raise InvalidRequestError(
                f"dim_bindings.{key}", f"the model has no symbolic dim {key!r} (its symbolic "
                f"dims: {sorted(g.dim_bindings) or 'none'}; the batch is set by the batch size)")
    own = graph_batch(g)
    rebatch = batch is not None and own is not None and own != batch
    if not rebatch and not unused:
        return g
    model = loading.parse_model(loading.read_model_bytes(source), label)
    if rebatch:
        _set_batch(model, batch)
    exported_sequence = _set_sequence(model, dims[SEQUENCE_DIM]) if unused else None
    try:
        freed = loading.load_model(model.SerializeToString(), batch=batch, dim_bindings=dims,
                                   name=name or g.name, label=label)
    except GpuplanError as exc:
        raise _refusal(own, batch, rebatch, exported_sequence, dims, str(exc)) from exc
    if rebatch and graph_batch(freed) != batch:
        raise _refusal(own, batch, rebatch, exported_sequence, dims, "its constants keep it")
    return freed


def _refusal(own: int | None, batch: int | None, rebatch: bool, exported_sequence: int | None,
             dims: Mapping[str, int], why: str) -> InvalidRequestError:
    if not rebatch:
        return InvalidRequestError(
            f"dim_bindings.{SEQUENCE_DIM}",
            f"the model has a fixed sequence of {exported_sequence} and re-sequencing it to "
            f"{dims[SEQUENCE_DIM]} failed: {why}; export it with a dynamic sequence dim")
    also = (f" (and re-sequencing from {exported_sequence} to {dims[SEQUENCE_DIM]})"
            if exported_sequence is not None else "")
    return InvalidRequestError(
        "batch", f"the model has a fixed batch of {own} and re-batching it to {batch}{also} "
        f"failed: {why}")


def _set_sequence(model: onnx.ModelProto, length: int) -> int:
    """Set axis 1 of the integer inputs, and entry 1 of constant Reshape and Expand targets
    at the exported length, to `length`; return the exported length."""
    lengths: set[int] = set()
    for value in _free_inputs(model):
        tt = value.type.tensor_type
        if tt.elem_type not in _TOKEN_TYPES or len(tt.shape.dim) < 2:
            continue
        dim = tt.shape.dim[1]
        if dim.HasField("dim_value"):
            lengths.add(dim.dim_value)
            dim.dim_value = length
    if len(lengths) != 1:
        raise InvalidRequestError(
            f"dim_bindings.{SEQUENCE_DIM}",
            "the model has no integer input of fixed length to re-sequence" if not lengths
            else f"its integer inputs disagree on the sequence ({sorted(lengths)})")
    (exported,) = lengths
    del model.graph.value_info[:]
    for value in model.graph.output:
        dims = value.type.tensor_type.shape.dim
        if len(dims) > 1 and dims[1].HasField("dim_value") and dims[1].dim_value == exported:
            dims[1].dim_value = length
    _edit_shape_targets(model, 1, lambda entry: length if entry == exported else None,
                        _SHAPE_TARGET_OPS)
    return exported


_TOKEN_TYPES = frozenset({onnx.TensorProto.INT64, onnx.TensorProto.INT32})


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
    """Leading dim of the free inputs (and of outputs and of Reshape and Expand targets at
    the exported batch) set to `batch`, or made symbolic when `batch` is None (Reshape
    targets then get 0); in place."""
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
    new = 0 if batch is None else batch
    # 0 is "copy from the input" for Reshape only: a symbolic batch leaves Expand alone.
    ops = _SHAPE_TARGET_OPS if batch is not None else frozenset({"Reshape"})
    _edit_shape_targets(model, 0, lambda entry: new if entry in exported else None, ops)


_SHAPE_TARGET_OPS = frozenset({"Reshape", "Expand"})
"""Ops whose second input is the output shape: where exporters write the batch and length."""


def _edit_shape_targets(model: onnx.ModelProto, index: int,
                        rewrite: Callable[[int], int | None], ops: frozenset[str]) -> None:
    """Rewrite entry `index` of each constant shape target of `ops`: an initializer, a
    Constant node's `value` or `value_ints`, or one such piece of a Concat (as dynamo exports
    build them). `rewrite` gets the entry and returns its new value, or None to keep it."""
    initializers = {t.name: t for t in model.graph.initializer}
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type not in ops or len(node.input) < 2:
            continue
        target = producers.get(node.input[1])
        pieces = (list(target.input) if target is not None and target.op_type == "Concat"
                  else [node.input[1]])
        offset = 0
        for piece in pieces:
            size = _edit_piece(piece, index - offset, rewrite, initializers, producers)
            if size is None:
                break  # a computed piece: later entries' positions are unknown
            offset += size


def _edit_piece(name: str, position: int, rewrite: Callable[[int], int | None],
                initializers: Mapping[str, onnx.TensorProto],
                producers: Mapping[str, onnx.NodeProto]) -> int | None:
    """Rewrite entry `position` of a constant 1-D piece; its length (None if not constant)."""
    tensors = [initializers[name]] if name in initializers else []
    node = producers.get(name)
    if node is not None and node.op_type == "Constant":
        for attr in node.attribute:
            if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
                tensors.append(attr.t)
            elif attr.name == "value_ints" and attr.type == onnx.AttributeProto.INTS:
                new = rewrite(attr.ints[position]) if 0 <= position < len(attr.ints) else None
                if new is not None:
                    attr.ints[position] = new
                return len(attr.ints)
    if not tensors:
        return None
    try:
        values = numpy_helper.to_array(tensors[0]).astype(np.int64).reshape(-1)
    except (ValueError, TypeError):  # data that does not fill its dims: not a usable target
        return None
    new = rewrite(int(values[position])) if 0 <= position < values.size else None
    if new is not None:
        values[position] = new
        tensors[0].CopyFrom(numpy_helper.from_array(values, tensors[0].name))
    return int(values.size)
