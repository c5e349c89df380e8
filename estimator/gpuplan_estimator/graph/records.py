"""Pure: a plain-data graph record (from `graph`) → `Layer`s with parameters and costs.

Tensors fall in three kinds. *Weights*: float initializers / Constants with more than one
element, and float `ConstantOfShape` outputs whose shape is a literal (structure-only graphs).
*Static*: shape computations (Shape, integer constants, anything computed only from static
tensors) — these nodes cost nothing. Everything else is *data*. Views of a weight (Transpose,
Unsqueeze, Cast, ...) are free and keep pointing at the weight, so a parameter read through
a view, or by two nodes (tied embeddings), is counted exactly once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import FLOAT_DTYPES, Layer, OpFamily, TensorInfo
from gpuplan_estimator.graph import contrib, opcost, sequences

# Fallback shape rules when ONNX inference leaves an output unknown.
_SAME_SHAPE_OPS = frozenset({
    "Relu", "LeakyRelu", "Sigmoid", "Tanh", "Erf", "Gelu", "FastGelu", "Exp", "Log", "Sqrt",
    "Neg", "Abs", "Reciprocal", "Floor", "Ceil", "Sin", "Cos", "Softplus", "Elu", "Selu",
    "HardSigmoid", "HardSwish", "Mish", "Dropout", "Identity", "Softmax", "LogSoftmax",
    "LayerNormalization", "BatchNormalization", "InstanceNormalization", "GroupNormalization",
    "SimplifiedLayerNormalization", "RMSNormalization", "Clip", "Not", "Sign", "Round",
})
_BROADCAST_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Where",
                            "PRelu", "Mod"})
_BOOL_OUTPUT_OPS = frozenset({"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                              "And", "Or", "Xor", "Not", "IsNaN", "IsInf"})
# Graph inputs (no initializer) count as weights only in these slots and only when declared
# with fully static shapes: structure-only graphs that list weights as inputs.
_INPUT_WEIGHT_SLOTS: Mapping[str, frozenset[int]] = {
    **{op: slots for op, slots in opcost.PARAMETER_SLOTS.items() if op != "MatMul"},
    "MatMul": frozenset({1}),
}


@dataclass(frozen=True)
class NodeRecord:
    """One ONNX node as plain data: op type, input/output tensor names, attributes."""
    name: str
    op_type: str
    inputs: tuple[str, ...]  # "" marks an omitted optional input
    outputs: tuple[str, ...]
    attributes: Mapping[str, Any]
    has_subgraph: bool = False


@dataclass(frozen=True)
class GraphRecord:
    """A graph as plain data: nodes, shape-known tensors, initializers, inputs, outputs."""
    nodes: tuple[NodeRecord, ...]
    tensors: Mapping[str, TensorInfo]  # every tensor whose shape is fully known
    initializers: frozenset[str]
    data_inputs: frozenset[str]  # graph inputs without an initializer
    graph_outputs: frozenset[str]
    symbolic_inputs: frozenset[str] = frozenset()  # inputs declared with a symbolic dim
    int_constants: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """Values of small integer initializers and Constant outputs (split sizes, positions)."""
    folded: frozenset[str] = frozenset()
    """Constants the loader computed from shapes (not literals of the file): a
    `ConstantOfShape` of one is data, such as a causal mask, never a stripped weight."""


@dataclass
class _State:
    tensors: dict[str, TensorInfo]
    static: set[str] = field(default_factory=set)
    weight_of: dict[str, str] = field(default_factory=dict)  # tensor → weight (root) name
    counted: set[str] = field(default_factory=set)
    consumed: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)
    sequences: dict[str, tuple[TensorInfo, ...]] = field(default_factory=dict)


def build_layers(
    record: GraphRecord, *, opset: int, label: str
) -> tuple[tuple[Layer, ...], tuple[str, ...]]:
    """Layers in node order and the sorted op types that landed in OpFamily.OTHER."""
    state = _State(tensors=dict(record.tensors))
    literals = set(record.initializers)
    for name in record.initializers:
        info = state.tensors.get(name)
        if info is not None and info.dtype in FLOAT_DTYPES and info.elements > 1:
            state.weight_of[name] = name
        else:
            state.static.add(name)
    for node in record.nodes:
        state.consumed.update(node.inputs)
        if node.op_type == "Constant":
            literals.update(o for o in node.outputs if o not in record.folded)
    layers: list[Layer] = []
    unknown: set[str] = set()
    for index, node in enumerate(record.nodes):
        layer = _layer(node, index, record, state, literals, opset, label)
        if layer.family is OpFamily.OTHER:
            unknown.add(node.op_type)
        if node.op_type in contrib.ATTENTION_OPS and layer.family is not OpFamily.SHAPE_ONLY:
            layers.extend(_attention_layers(node, layer, opset, label))
        else:
            layers.append(layer)
    return tuple(layers), tuple(sorted(unknown))


def _attention_layers(node: NodeRecord, fused: Layer, opset: int,
                      label: str) -> list[Layer]:
    """A fused com.microsoft attention as the kernels it runs: the packed QKV projection
    (`Attention` only, carrying its weights), Q·Kᵀ per head, softmax, probs·V."""
    where = f"{label}: node {fused.name!r} ({node.op_type})"
    by_name = {t.name: t.shape for t in fused.inputs}
    shapes = [by_name.get(t) if t else None for t in node.inputs]
    parts = contrib.attention_parts(node.op_type, shapes, node.attributes, where)
    dtype = fused.outputs[0].dtype if fused.outputs else fused.inputs[0].dtype
    b, n, s, kv = parts.batch, parts.heads, parts.query_length, parts.key_length

    def tensor(suffix: str, shape: tuple[int, ...]) -> TensorInfo:
        return TensorInfo(f"{fused.name}/{suffix}", shape, dtype)

    q = tensor("q", (b, n, s, parts.qk_head_size))
    k = tensor("k", (b, n, parts.qk_head_size, kv))
    v = tensor("v", (b, n, kv, parts.v_head_size))
    scores, probs = tensor("scores", (b, n, s, kv)), tensor("probs", (b, n, s, kv))
    out_name = fused.outputs[0].name if fused.outputs else f"{fused.name}/out"
    context = TensorInfo(out_name, (b, n, s, parts.v_head_size), dtype)
    pieces: list[tuple[str, str, list[TensorInfo], TensorInfo]] = []
    if parts.projection is not None:
        x, w = fused.inputs[0], fused.inputs[1]
        pieces.append(("qkv", "MatMul", [x, w], tensor("qkv", (*x.shape[:-1], w.shape[1]))))
    pieces += [("scores", "MatMul", [q, k], scores), ("softmax", "Softmax", [scores], probs),
               ("context", "MatMul", [probs, v], context)]
    layers = []
    for index, (suffix, op_type, inputs, output) in enumerate(pieces):
        family = OpFamily.SOFTMAX if op_type == "Softmax" else OpFamily.MATMUL
        attrs = opcost.normalize_attributes(op_type, inputs, [output], {}, opset)
        read, written = opcost.node_bytes(op_type, family, inputs, [output])
        carries_weights = index == 0 and parts.projection is not None
        layers.append(Layer(
            name=f"{fused.name}/{suffix}", op_type=op_type, family=family,
            inputs=tuple(inputs), outputs=(output,),
            flops=opcost.node_flops(op_type, family, inputs, [output], attrs),
            bytes_read=read, bytes_written=written,
            parameter_count=fused.parameter_count if carries_weights else 0,
            parameter_inputs=fused.parameter_inputs if carries_weights else (),
            attributes=attrs))
    return layers


def _unique_name(node: NodeRecord, index: int, state: _State) -> str:
    name = node.name or f"{node.op_type}_{index}"
    if name in state.names:
        name = f"{name}_{index}"
    state.names.add(name)
    return name


def _inputs(node: NodeRecord, name: str, record: GraphRecord, state: _State,
            label: str) -> list[TensorInfo]:
    infos = []
    for tensor in node.inputs:
        if not tensor:
            continue
        info = state.tensors.get(tensor)
        if info is None:
            raise errors.InvalidModelError(
                f"{label}: node {name!r} ({node.op_type}) input {tensor!r} has no known shape "
                f"(no producer, or shape inference could not resolve it)"
            )
        infos.append(info)
    return infos


def _layer(node: NodeRecord, index: int, record: GraphRecord, state: _State,
           literals: set[str], opset: int, label: str) -> Layer:
    name = _unique_name(node, index, state)
    if node.op_type in sequences.SEQUENCE_OPS:
        inputs, outputs = _sequence_tensors(node, name, record, state, label)
    else:
        inputs = _inputs(node, name, record, state, label)
        outputs = _outputs(node, name, inputs, record, state, label)
    _check_view(node, name, inputs, outputs, label)
    present = [t for t in node.inputs if t]
    inputs_static = all(t in state.static for t in present)
    weight_inputs = _weight_inputs(node, record, state)
    family = opcost.classify(node.op_type, node.attributes, inputs_static=inputs_static,
                             gathers_parameter=0 in weight_inputs)
    if node.has_subgraph:
        family = OpFamily.OTHER
    if not outputs and family not in (OpFamily.SHAPE_ONLY, OpFamily.OTHER):
        raise errors.InvalidModelError(
            f"{label}: node {name!r} ({node.op_type}) output "
            f"{next(iter(node.outputs), '')!r} has no concrete shape after shape inference")
    _mark_outputs(node, family, outputs, weight_inputs, inputs_static, literals, state)
    is_view = _is_weight_view(node, weight_inputs, state)
    if is_view:
        family = OpFamily.SHAPE_ONLY
    roots, count = _parameters(node, weight_inputs, state, is_view)
    attrs = opcost.normalize_attributes(node.op_type, inputs, outputs, node.attributes, opset)
    flops = opcost.node_flops(node.op_type, family, inputs, outputs, attrs)
    read, written = opcost.node_bytes(node.op_type, family, inputs, outputs)
    return Layer(name=name, op_type=node.op_type, family=family, inputs=tuple(inputs),
                 outputs=tuple(outputs), flops=flops, bytes_read=read, bytes_written=written,
                 parameter_count=count, parameter_inputs=roots, attributes=attrs)


ELEMENT_PRESERVING_VIEWS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze"})
"""Ops that only relabel a tensor's shape: their output holds as many elements as their input."""


def _check_view(node: NodeRecord, name: str, inputs: Sequence[TensorInfo],
                outputs: Sequence[TensorInfo], label: str) -> None:
    """A view that changes the element count is a shape contradiction (e.g. a constant that
    keeps an exported batch): refuse it rather than price tensors that cannot exist."""
    if node.op_type not in ELEMENT_PRESERVING_VIEWS or not inputs or not outputs:
        return
    if inputs[0].elements != outputs[0].elements:
        raise errors.InvalidModelError(
            f"{label}: node {name!r} ({node.op_type}) turns {list(inputs[0].shape)} "
            f"({inputs[0].elements} elements) into {list(outputs[0].shape)} "
            f"({outputs[0].elements}): the shapes contradict each other")


def _outputs(node: NodeRecord, name: str, inputs: Sequence[TensorInfo], record: GraphRecord,
             state: _State, label: str) -> list[TensorInfo]:
    outputs = []
    for tensor in node.outputs:
        if not tensor:
            continue
        info = state.tensors.get(tensor) or _propagate(node, tensor, inputs)
        if info is None:
            needed = tensor in state.consumed or tensor in record.graph_outputs
            if needed and not node.has_subgraph:
                raise errors.InvalidModelError(
                    f"{label}: node {name!r} ({node.op_type}) output {tensor!r} has no "
                    f"concrete shape after shape inference"
                )
            continue  # unused optional output (e.g. a Dropout mask), or a control-flow result
        state.tensors[tensor] = info
        outputs.append(info)
    return outputs


def _sequence_tensors(node: NodeRecord, name: str, record: GraphRecord, state: _State,
                      label: str) -> tuple[list[TensorInfo], list[TensorInfo]]:
    """Inputs and outputs of a sequence op as tensors: a sequence stands for its elements."""
    where = f"{label}: node {name!r} ({node.op_type})"
    present = [t for t in node.inputs if t]

    def elements(tensor: str) -> tuple[TensorInfo, ...]:
        if tensor not in state.sequences:
            raise errors.InvalidModelError(f"{where}: sequence {tensor!r} has unknown elements")
        return state.sequences[tensor]

    def tensor_of(tensor: str) -> TensorInfo:
        info = state.tensors.get(tensor)
        if info is None:
            raise errors.InvalidModelError(f"{where}: input {tensor!r} has no known shape")
        return info

    arity = {"SplitToSequence": 1, "SequenceAt": 2, "ConcatFromSequence": 1,
             "SequenceLength": 1, "SequenceInsert": 2}.get(node.op_type, 0)
    if len(present) < arity or not node.outputs:
        raise errors.InvalidModelError(
            f"{where}: needs {arity} input(s) and an output, has {len(present)} and "
            f"{len(node.outputs)}")
    out = node.outputs[0]
    attrs = node.attributes

    def int_attr(key: str, default: int) -> int:
        return opcost.int_attribute(node.op_type, attrs, key, default)

    if node.op_type == "SplitToSequence":
        x = tensor_of(present[0])
        sizes = (sequences.constant_int(record.int_constants, node.inputs[1], where, "split")
                 if len(node.inputs) > 1 and node.inputs[1] else None)
        pieces = sequences.split(x, out, sizes, int_attr("axis", 0),
                                 bool(int_attr("keepdims", 1)), where)
        state.sequences[out] = pieces
        return [x], list(pieces)
    if node.op_type == "SequenceConstruct":
        items = tuple(tensor_of(t) for t in present)
        state.sequences[out] = tuple(TensorInfo(n, t.shape, t.dtype) for n, t in zip(
            sequences.element_names(out, len(items)), items, strict=True))
        return list(items), list(state.sequences[out])
    if node.op_type == "SequenceEmpty":
        state.sequences[out] = ()
        return [], []
    if node.op_type == "SequenceInsert":
        grown = list(elements(present[0]))
        value = tensor_of(present[1])
        position = (sequences.constant_scalar(record.int_constants, present[2], where,
                                              "position") if len(present) > 2 else len(grown))
        grown.insert(position if position >= 0 else len(grown) + position + 1, value)
        state.sequences[out] = tuple(TensorInfo(n, t.shape, t.dtype) for n, t in zip(
            sequences.element_names(out, len(grown)), grown, strict=True))
        return [value], list(state.sequences[out])
    seq = elements(present[0])
    if node.op_type == "SequenceAt":
        position = sequences.constant_scalar(record.int_constants, present[1], where,
                                             "position")
        picked = sequences.at(seq, position, out, where)  # checks the position
        result = state.tensors.get(out) or picked
        chosen = seq[position]
    elif node.op_type == "ConcatFromSequence":
        result = state.tensors.get(out) or sequences.concat(
            seq, out, int_attr("axis", 0), bool(int_attr("new_axis", 0)), where)
        state.tensors[out] = result
        return list(seq), [result]
    else:  # SequenceLength
        result = TensorInfo(out, (), "int64")
        chosen = None
    state.tensors[out] = result
    return ([chosen] if chosen is not None else []), [result]


def _propagate(node: NodeRecord, tensor: str, inputs: Sequence[TensorInfo]) -> TensorInfo | None:
    if not inputs or tensor != node.outputs[0]:
        return None
    dtype = "bool" if node.op_type in _BOOL_OUTPUT_OPS else inputs[-1].dtype
    if node.op_type in _SAME_SHAPE_OPS:
        return TensorInfo(tensor, inputs[0].shape, inputs[0].dtype if dtype != "bool" else dtype)
    if node.op_type in _BROADCAST_OPS or node.op_type in _BOOL_OUTPUT_OPS:
        shape = _broadcast([t.shape for t in inputs])
        return None if shape is None else TensorInfo(tensor, shape, dtype)
    return None


def _broadcast(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...] | None:
    rank = max(len(s) for s in shapes)
    out = []
    for axis in range(rank):
        sizes = {s[axis - rank + len(s)] for s in shapes if axis - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _weight_inputs(node: NodeRecord, record: GraphRecord, state: _State) -> dict[int, str]:
    """Slot → weight root name, for inputs that are weights (or views of one)."""
    found: dict[int, str] = {}
    input_slots = _INPUT_WEIGHT_SLOTS.get(node.op_type, frozenset())
    for slot, tensor in enumerate(node.inputs):
        if tensor in state.weight_of:
            found[slot] = state.weight_of[tensor]
        elif (slot in input_slots and tensor in record.data_inputs
              and tensor not in record.symbolic_inputs):
            info = state.tensors.get(tensor)
            if info is not None and info.dtype in FLOAT_DTYPES:
                state.weight_of[tensor] = tensor
                found[slot] = tensor
    return found


def _mark_outputs(node: NodeRecord, family: OpFamily, outputs: Sequence[TensorInfo],
                  weight_inputs: Mapping[int, str], inputs_static: bool, literals: set[str],
                  state: _State) -> None:
    if node.op_type == "Constant":
        for out in outputs:
            if out.dtype in FLOAT_DTYPES and out.elements > 1:
                state.weight_of[out.name] = out.name
            else:
                state.static.add(out.name)
        return
    if node.op_type == "ConstantOfShape" and node.inputs and node.inputs[0] in literals:
        for out in outputs:  # the replace_constants convention for a stripped weight
            if out.dtype in FLOAT_DTYPES:
                state.weight_of[out.name] = out.name
            else:
                state.static.add(out.name)
        return
    if node.op_type in ("Shape", "Size") or (inputs_static and family is not OpFamily.OTHER):
        state.static.update(o.name for o in outputs)
    elif _is_weight_view(node, weight_inputs, state):
        for out in outputs:
            state.weight_of[out.name] = weight_inputs[0]


def _is_weight_view(node: NodeRecord, weight_inputs: Mapping[int, str], state: _State) -> bool:
    if node.op_type not in opcost.VIEW_OPS or 0 not in weight_inputs:
        return False
    return all(t in state.static for t in node.inputs[1:] if t)


def _parameters(node: NodeRecord, weight_inputs: Mapping[int, str], state: _State,
                is_view: bool) -> tuple[tuple[str, ...], int]:
    """Trainable weight roots this node reads, and the elements it is first to count."""
    if is_view or node.op_type in ("Constant", "ConstantOfShape"):
        return (), 0
    excluded = opcost.NON_PARAMETER_SLOTS.get(node.op_type, frozenset())
    roots: list[str] = []
    count = 0
    for slot, root in sorted(weight_inputs.items()):
        if slot in excluded or root in roots:
            continue
        roots.append(root)
        if root not in state.counted:
            state.counted.add(root)
            count += state.tensors[root].elements
    return tuple(roots), count
