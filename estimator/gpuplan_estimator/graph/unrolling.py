"""Control flow with a static shape: an `If` on a constant and a `Loop` of constant trip count
become plain nodes, so every kernel they run is a layer and is priced.

An `If` whose condition is known becomes the branch it takes. A `Loop` whose trip count is
known, whose condition cannot end it early (absent or constant true, passed through by the
body unchanged) and whose unrolled size stays under `MAX_UNROLLED_NODES` becomes its body
repeated once per iteration: loop-carried values chained from one copy to the next, the
iteration number a constant, scan outputs stacked along a new leading axis as the operator
defines them. Anything else is left alone and listed as uncovered by the caller.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

MAX_UNROLLED_NODES = 10_000
"""Most nodes an inlined branch or an unrolled loop may add: 2x a stripped GPT-2 XL."""


def text_names(node: onnx.NodeProto) -> bool:
    """Whether every name of `node` decoded as text: protobuf hands a hostile file's invalid
    UTF-8 back as bytes, which no rewritten node may carry."""
    return all(isinstance(n, str) for n in (node.name, *node.input, *node.output))


def inline_constant_if(node: onnx.NodeProto,
                       values: Mapping[str, np.ndarray]) -> list[onnx.NodeProto] | None:
    """The branch an `If` with a known condition takes, its outputs renamed to the If's."""
    condition = values.get(node.input[0]) if node.input else None
    if condition is None or condition.size != 1:
        return None
    branch_name = "then_branch" if bool(condition.reshape(-1)[0]) else "else_branch"
    branch = _graph_attribute(node, branch_name)
    if (branch is None or len(branch.output) != len(node.output) or branch.initializer
            or len(branch.node) > MAX_UNROLLED_NODES or not _text_graph(branch)):
        return None
    prefix = f"{node.name or 'If'}/{branch_name}/"
    renamed = dict(zip((o.name for o in branch.output), node.output, strict=True))
    return _copy(branch, prefix, renamed, outputs=dict(renamed))


def unroll_static_loop(node: onnx.NodeProto, values: Mapping[str, np.ndarray],
                       opset: int) -> list[onnx.NodeProto] | None:
    """A `Loop` of known trip count as its body once per iteration, or None to keep it."""
    body = _graph_attribute(node, "body")
    trips = values.get(node.input[0]) if node.input and node.input[0] else None
    if (body is None or trips is None or trips.size != 1 or trips.dtype.kind not in "iu"
            or not _text_graph(body)):
        return None
    count = int(trips.reshape(-1)[0])
    carried = len(node.input) - 2
    scans = len(body.output) - 1 - carried
    if (count < 1 or carried < 0 or scans < 0 or len(body.input) != 2 + carried
            or len(node.output) != carried + scans or body.initializer
            or count * (len(body.node) + 2) > MAX_UNROLLED_NODES
            or not _never_ends_early(node, body, values)):
        return None
    name = node.name or "Loop"
    nodes: list[onnx.NodeProto] = []
    state = list(node.input[2:])
    stacked: list[list[str]] = [[] for _ in range(scans)]
    for iteration in range(count):
        prefix = f"{name}/iter{iteration}/"
        counter, condition = prefix + "iteration", prefix + "condition"
        nodes.append(_scalar(counter, np.array(iteration, np.int64)))
        nodes.append(_scalar(condition, np.array(True)))
        renamed = {body.input[0].name: counter, body.input[1].name: condition,
                   **dict(zip((v.name for v in body.input[2:]), state, strict=True))}
        nodes += _copy(body, prefix, renamed, outputs={})
        produced = [renamed.get(o.name, prefix + o.name if _local(body, o.name) else o.name)
                    for o in body.output]
        state = produced[1:1 + carried]
        for k, tensor in enumerate(produced[1 + carried:]):
            stacked[k].append(tensor)
    for final, outer in zip(state, node.output[:carried], strict=True):
        nodes.append(helper.make_node("Identity", [final], [outer], name=f"{name}/{outer}"))
    for k, outer in enumerate(node.output[carried:]):
        nodes += _stack(stacked[k], outer, f"{name}/{outer}", opset)
    return nodes


def _never_ends_early(node: onnx.NodeProto, body: onnx.GraphProto,
                      values: Mapping[str, np.ndarray]) -> bool:
    """The loop's condition is absent or constant true, and the body passes it through
    (directly, through an Identity, or as a constant true)."""
    if len(node.input) > 1 and node.input[1] and not _true(values.get(node.input[1])):
        return False
    returned, condition = body.output[0].name, body.input[1].name
    if returned == condition:
        return True
    producer = next((n for n in body.node if returned in n.output), None)
    if producer is None:
        return False
    if producer.op_type == "Identity":
        return list(producer.input) == [condition]
    if producer.op_type == "Constant":
        tensor = next((a.t for a in producer.attribute
                       if a.name == "value" and a.type == onnx.AttributeProto.TENSOR), None)
        try:
            return tensor is not None and _true(numpy_helper.to_array(tensor))
        except (ValueError, TypeError):  # data that does not fill its dims
            return False
    return False


def _true(value: np.ndarray | None) -> bool:
    return value is not None and value.size == 1 and bool(value.reshape(-1)[0])


def _graph_attribute(node: onnx.NodeProto, name: str) -> onnx.GraphProto | None:
    return next((a.g for a in node.attribute
                 if a.name == name and a.type == onnx.AttributeProto.GRAPH), None)


def _text_graph(graph: onnx.GraphProto) -> bool:
    return (all(text_names(n) for n in graph.node)
            and all(isinstance(v.name, str) for v in (*graph.input, *graph.output)))


def _local(graph: onnx.GraphProto, tensor: str) -> bool:
    return any(tensor in n.output for n in graph.node)


def _copy(graph: onnx.GraphProto, prefix: str, renamed: Mapping[str, str],
          outputs: Mapping[str, str]) -> list[onnx.NodeProto]:
    """`graph`'s nodes with their own tensors prefixed and `renamed` applied; outer-scope
    names pass unchanged. `outputs` maps graph outputs that need an Identity (an outer-scope
    name returned as is) to the name the caller expects."""
    local = {o for n in graph.node for o in n.output if o}
    formal = {v.name for v in graph.input}
    names = {t: prefix + t for t in local}
    names.update({k: v for k, v in renamed.items() if k in local or k in formal})
    nodes = []
    for inner in graph.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = prefix + (inner.name or inner.op_type)
        copy.input[:] = [names.get(i, i) for i in inner.input]
        copy.output[:] = [names.get(o, o) for o in inner.output]
        nodes.append(copy)
    for inner, outer in outputs.items():
        if inner not in local:
            nodes.append(helper.make_node("Identity", [inner], [outer],
                                          name=prefix + f"Identity:{outer}"))
    return nodes


def _scalar(name: str, value: np.ndarray) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name,
                            value=numpy_helper.from_array(value, name))


def _stack(tensors: list[str], output: str, name: str, opset: int) -> list[onnx.NodeProto]:
    """Unsqueeze each iteration's scan output at axis 0 and concatenate: [trips, ...]."""
    nodes = []
    expanded = []
    axes = f"{name}/axes"
    if opset >= 13:
        nodes.append(_scalar(axes, np.array([0], np.int64)))
    for index, tensor in enumerate(tensors):
        out = f"{name}/{index}"
        nodes.append(helper.make_node("Unsqueeze", [tensor, axes], [out], name=out)
                     if opset >= 13 else
                     helper.make_node("Unsqueeze", [tensor], [out], name=out, axes=[0]))
        expanded.append(out)
    nodes.append(helper.make_node("Concat", expanded, [output], name=name, axis=0))
    return nodes
