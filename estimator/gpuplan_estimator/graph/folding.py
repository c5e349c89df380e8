"""Shape-value folding: the estimator's own shape propagation where onnx's inference stops.

Exporters compute shapes inside the graph (`Shape → Gather → Concat → Expand`, `Range` over a
sequence length, a conv bias synthesised as `Expand(0, Shape(W)[0:1])`). onnx's shape inference
propagates such values through a few ops only, so a tensor downstream of, say, `Expand` of a
computed shape is left without a shape. Once the input dims are bound every such value is a
constant: this module evaluates those nodes with onnx's reference implementation (a
well-kept library, not hand-written kernels), replaces each by a `Constant` of its value, and
lets shape inference run again until nothing new folds.

Only *shape values* are folded: integer and boolean tensors and float scalars up to
`MAX_FOLD_ELEMENTS`, whose size is known before they are computed. Float tensors of more than
one element are never materialised (they would read as weights), and nothing here guesses:
a node that cannot be evaluated is left as it was. `If` with a constant condition is replaced
by the branch it takes, and a `Loop` with a static trip count by its unrolled body
(`unrolling`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops import load_op

from gpuplan_estimator.core import errors
from gpuplan_estimator.graph import unrolling

MAX_FOLD_ELEMENTS = 1 << 16
"""Largest value folded: positions of a 64 Ki-token sequence; a shape never comes near it."""
MAX_ROUNDS = 6
"""Fold and re-infer at most this often: each round resolves one more layer of
shape-of-a-computed-shape, and real exports need two."""

_INT_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32, TensorProto.INT16,
                        TensorProto.INT8, TensorProto.UINT8, TensorProto.BOOL})
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16})

_ELEMENTWISE = frozenset({
    "Add", "Sub", "Mul", "Div", "Mod", "Neg", "Abs", "Max", "Min", "Equal", "Less", "Greater",
    "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Where", "Cast", "CastLike",
    "Identity", "Floor", "Ceil", "Sqrt", "Clip", "Sign", "Reciprocal", "Pow", "Round",
})
"""Ops whose output is at most the broadcast of their inputs."""
_NO_GROWTH = frozenset({
    "Gather", "GatherElements", "GatherND", "Slice", "Concat", "Unsqueeze", "Squeeze",
    "Reshape", "Flatten", "Transpose", "ReduceProd", "ReduceSum", "ReduceMax", "ReduceMin",
    "ReduceMean", "CumSum", "ArgMax", "ArgMin", "Split", "Trilu", "ScatterND",
    "ScatterElements", "NonZero",
})
"""Ops whose output holds no more elements than their inputs together."""
_GROWING = frozenset({"Range", "ConstantOfShape", "Expand", "Tile"})
"""Ops whose output size is computed from their input values, checked before they run."""
FOLDABLE_OPS = _ELEMENTWISE | _NO_GROWTH | _GROWING


def fold_shape_values(
    model: onnx.ModelProto, infer: Callable[[onnx.ModelProto], onnx.ModelProto]
) -> tuple[onnx.ModelProto, frozenset[str]]:
    """`infer(model)` with every computable shape value folded and inferred again; and the
    names of the tensors folded (computed values, not literals the file wrote)."""
    inferred = infer(model)
    folded: set[str] = set()
    for _ in range(MAX_ROUNDS):
        if not _fold_once(inferred, folded):
            break
        inferred = infer(inferred)
    return inferred, frozenset(folded)


MAX_RANGE_ELEMENTS = 1 << 24
"""Longest `Range` of constants accepted: onnx's data propagation materialises it during
inference (a Range of 2^40 asks for 8 TB), and no shape computation comes near it."""


def check_ranges(model: onnx.ModelProto, label: str) -> None:
    """Refuse, before shape inference runs, a `Range` whose inputs are computable from the
    graph's constants and input dims and whose length is beyond any shape computation."""
    graph = model.graph
    if not any(node.op_type == "Range" for node in graph.node):
        return  # nothing to check; propagating every value is most of a load's time
    opset = _default_opset(model)
    values = _known_values(graph)
    shapes = _known_shapes(graph)
    for index, node in enumerate(graph.node):
        if node.domain not in ("", "ai.onnx") or not node.output or not unrolling.text_names(node):
            continue
        args = [values.get(name) for name in node.input[:3]]
        if node.op_type == "Range" and len(args) == 3 and all(a is not None for a in args):
            length = _output_bound("Range", [a for a in args if a is not None])
            if length is None or length > MAX_RANGE_ELEMENTS:
                raise errors.InvalidModelError(
                    f"{label}: node {node.name or f'Range_{index}'!r} (Range) would hold "
                    f"{'an unbounded number of' if length is None else length} elements "
                    f"(at most {MAX_RANGE_ELEMENTS} in a shape computation)")
        outputs = (_shape_of(node, shapes) if node.op_type in ("Shape", "Size")
                   else _evaluate(node, values, opset) if node.op_type in FOLDABLE_OPS
                   else None)
        for name, value in zip(node.output, outputs or (), strict=False):
            values[name] = value


def _fold_once(model: onnx.ModelProto, folded: set[str]) -> bool:
    """Fold what is computable now, in place, adding to `folded`; whether anything changed."""
    graph = model.graph
    opset = _default_opset(model)
    values = _known_values(graph)
    shapes = _known_shapes(graph)
    # Element types matter to CastLike alone; most graphs have none, and this runs per round.
    types = (_known_types(graph) if any(node.op_type == "CastLike" for node in graph.node)
             else {})
    changed = False
    rewritten: list[onnx.NodeProto] = []
    for node in graph.node:
        replacement = _fold_node(node, values, shapes, opset, types)
        if replacement is None:
            rewritten.append(node)
            continue
        rewritten.extend(replacement)
        folded.update(o for n in replacement if n.op_type == "Constant" for o in n.output)
        changed = True
    if changed:
        del graph.node[:]
        graph.node.extend(rewritten)
    return changed


def _fold_node(node: onnx.NodeProto, values: dict[str, np.ndarray],
               shapes: Mapping[str, tuple[int, ...]],
               opset: int, types: Mapping[str, int]) -> list[onnx.NodeProto] | None:
    """Nodes to put in `node`'s place (Constants, or an inlined branch), or None to keep it."""
    if node.domain not in ("", "ai.onnx") or not node.output or not unrolling.text_names(node):
        return None
    if node.op_type == "If":
        return unrolling.inline_constant_if(node, values)
    if node.op_type == "Loop":
        return unrolling.unroll_static_loop(node, values, opset)
    if node.op_type in ("Shape", "Size"):
        outputs = _shape_of(node, shapes)
    elif node.op_type == "CastLike":
        outputs = _cast_like(node, values, types)
    elif node.op_type in FOLDABLE_OPS:
        outputs = _evaluate(node, values, opset)
    else:
        return None
    if outputs is None:
        return None
    for name, value in zip(node.output, outputs, strict=False):
        if name:
            values[name] = value
    return [_constant(node, name, value)
            for name, value in zip(node.output, outputs, strict=False) if name]


def _shape_of(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]
              ) -> list[np.ndarray] | None:
    shape = shapes.get(node.input[0]) if node.input else None
    if shape is None:
        return None
    if node.op_type == "Size":
        return [np.array(math.prod(shape), dtype=np.int64)]
    attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
    rank = len(shape)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return [np.array(shape[start:end], dtype=np.int64)]


def _evaluate(node: onnx.NodeProto, values: Mapping[str, np.ndarray],
              opset: int) -> list[np.ndarray] | None:
    present = list(node.input)
    if any(name and name not in values for name in present):
        return None
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
           for a in node.attribute):
        return None
    args = [values[name] if name else None for name in present]
    bound = _output_bound(node.op_type, [a for a in args if a is not None])
    if bound is None or bound > MAX_FOLD_ELEMENTS:
        return None
    try:
        with np.errstate(all="ignore"):
            op = load_op("", node.op_type, opset)(node, _RUN_PARAMS | {"opsets": {"": opset}})
            outputs = op.run(*args)
    except Exception:
        return None
    results = [np.asarray(o) for o in outputs]
    if not all(_is_shape_value(r) for r in results):
        return None
    return results


_RUN_PARAMS: dict[str, Any] = {"log": lambda *_: None, "verbose": 0, "new_ops": None,
                               "existing_functions": {}, "evaluator_cls": ReferenceEvaluator}


def _output_bound(op_type: str, args: Sequence[np.ndarray]) -> int | None:
    """Most elements the op can produce from `args`, worked out before running it."""
    try:
        if op_type in _ELEMENTWISE:
            return math.prod(np.broadcast_shapes(*(a.shape for a in args)))
        if op_type in _NO_GROWTH:
            return sum(a.size for a in args)
        if op_type == "ConstantOfShape":
            return math.prod(int(v) for v in args[0].reshape(-1))
        if op_type == "Expand":
            target = tuple(int(v) for v in args[1].reshape(-1))
            if any(v < 0 for v in target):
                return None
            return math.prod(np.broadcast_shapes(args[0].shape, target))
        if op_type == "Tile":
            return args[0].size * math.prod(int(v) for v in args[1].reshape(-1))
        if op_type == "Range":
            start, limit, delta = (float(a.reshape(-1)[0]) for a in args[:3])
            return max(0, math.ceil((limit - start) / delta)) if delta else None
    except (ValueError, IndexError, OverflowError, TypeError):
        return None
    return None


def _is_shape_value(value: np.ndarray) -> bool:
    if value.size > MAX_FOLD_ELEMENTS:
        return False
    if value.dtype.kind in "iub":
        return True
    return value.dtype.kind == "f" and value.size <= 1


def _constant(node: onnx.NodeProto, output: str, value: np.ndarray) -> onnx.NodeProto:
    """A Constant holding `value`, named after the node it replaces (so layers keep names)."""
    if value.dtype == np.uint64 or value.dtype == np.uint32:
        value = value.astype(np.int64)
    name = node.name if len(node.output) == 1 else f"{node.name}:{output}"
    return helper.make_node("Constant", [], [output], name=name,
                            value=numpy_helper.from_array(value, output))


def _default_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")),
                onnx.defs.onnx_opset_version())


def _known_values(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values: dict[str, np.ndarray] = {}
    for tensor in graph.initializer:
        value = small_array(tensor)
        if value is not None:
            values[tensor.name] = value
    for node in graph.node:
        if node.op_type == "Constant" and node.output:
            value = constant_value(node)
            if value is not None and _is_shape_value(value):
                values[node.output[0]] = value
    return values


def constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    """The value of a `Constant` node, whichever attribute holds it; None when it is not a
    small, readable tensor (sparse, external or short data, or over the fold limit)."""
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            return _array(attr.t) if math.prod(attr.t.dims) <= MAX_FOLD_ELEMENTS else None
        if attr.name == "value_int" and attr.type == onnx.AttributeProto.INT:
            return np.array(attr.i, dtype=np.int64)
        if attr.name == "value_ints" and attr.type == onnx.AttributeProto.INTS:
            return np.array(list(attr.ints)[:MAX_FOLD_ELEMENTS + 1], dtype=np.int64)
        if attr.name == "value_float" and attr.type == onnx.AttributeProto.FLOAT:
            return np.array(attr.f, dtype=np.float32)
        if attr.name == "value_floats" and attr.type == onnx.AttributeProto.FLOATS:
            return np.array(list(attr.floats)[:MAX_FOLD_ELEMENTS + 1], dtype=np.float32)
    return None


def _array(tensor: onnx.TensorProto) -> np.ndarray | None:
    if any(d < 0 for d in tensor.dims) or tensor.data_location == TensorProto.EXTERNAL:
        return None
    try:
        return numpy_helper.to_array(tensor)
    except (ValueError, TypeError):  # short data, or a type numpy cannot hold
        return None


def small_array_candidate(tensor: onnx.TensorProto) -> bool:
    """Whether an initializer can hold a shape value: integer or boolean up to the fold
    limit, or a scalar of any type. Everything else is a weight, read only for its dims."""
    elements = math.prod(tensor.dims)
    return elements <= 1 or (tensor.data_type in _INT_TYPES and elements <= MAX_FOLD_ELEMENTS)


def small_array(tensor: onnx.TensorProto) -> np.ndarray | None:
    """An initializer's value when it is a shape value (integer or boolean up to the fold
    limit, or a float scalar); None for weights and unreadable data."""
    small = small_array_candidate(tensor) and (
        tensor.data_type in _INT_TYPES or tensor.data_type in _FLOAT_TYPES)
    return _array(tensor) if small else None


def _known_shapes(graph: onnx.GraphProto) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {}
    for value in _value_infos(graph):
        tt = value.type.tensor_type
        if not value.type.HasField("tensor_type") or not tt.HasField("shape"):
            continue
        if all(d.HasField("dim_value") for d in tt.shape.dim):
            shapes[value.name] = tuple(d.dim_value for d in tt.shape.dim)
    for tensor in graph.initializer:
        shapes[tensor.name] = tuple(tensor.dims)
    return shapes


def _cast_like(node: onnx.NodeProto, values: Mapping[str, np.ndarray],
               types: Mapping[str, int]) -> list[np.ndarray] | None:
    """CastLike of a known value: only the second input's element type matters, so a scale
    exporters compute as `Sqrt(CastLike(head_dim, scores))` folds although the scores are
    data (eager PyTorch computes such a scale in Python, and launches nothing for it)."""
    if len(node.input) < 2 or node.input[0] not in values:
        return None
    target = types.get(node.input[1])
    if node.input[1] in values:
        target = helper.np_dtype_to_tensor_dtype(values[node.input[1]].dtype)
    if target is None or target not in _FLOAT_TYPES | _INT_TYPES:
        return None
    value = np.asarray(values[node.input[0]]).astype(helper.tensor_dtype_to_np_dtype(target))
    return [value] if _is_shape_value(value) else None


def _known_types(graph: onnx.GraphProto) -> dict[str, int]:
    types = {value.name: value.type.tensor_type.elem_type for value in _value_infos(graph)
             if value.type.HasField("tensor_type")}
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    return types


def _value_infos(graph: onnx.GraphProto) -> Iterable[onnx.ValueInfoProto]:
    yield from graph.input
    yield from graph.value_info
    yield from graph.output
