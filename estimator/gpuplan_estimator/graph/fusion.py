"""Pure: find groups of layers a framework typically runs as one kernel (fusion units).

Patterns are matched on producer/consumer structure, never on names: a unit is a chain (or a
small diamond) in which every intermediate tensor is consumed only inside the unit, so fusing
it never changes what the rest of the graph reads. Layers keep their own costs; a unit only
tells downstream pricing which layers may be priced as one kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from gpuplan_estimator.core.layers import FusionUnit, Layer

ACTIVATIONS = frozenset({
    "Relu", "Clip", "LeakyRelu", "Sigmoid", "Tanh", "HardSwish", "HardSigmoid", "Gelu",
    "FastGelu", "Elu", "Selu", "Celu", "Softplus", "Mish", "PRelu", "Swish",
})


class _Index:
    def __init__(self, layers: Sequence[Layer], graph_outputs: frozenset[str]) -> None:
        self.layers = layers
        self.graph_outputs = graph_outputs
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = {}
        for i, layer in enumerate(layers):
            for t in layer.outputs:
                self.producer[t.name] = i
            for t in layer.inputs:
                self.consumers.setdefault(t.name, []).append(i)

    def op(self, i: int | None) -> str:
        return self.layers[i].op_type if i is not None else ""

    def out(self, i: int) -> str:
        return self.layers[i].outputs[0].name if self.layers[i].outputs else ""

    def ins(self, i: int) -> list[str]:
        return [t.name for t in self.layers[i].inputs]

    def sole_consumer(self, i: int) -> int | None:
        users = self.consumers.get(self.out(i), [])
        return users[0] if len(users) == 1 else None

    def consumer_of(self, i: int, op_types: frozenset[str] | set[str]) -> int | None:
        j = self.sole_consumer(i)
        return j if self.op(j) in op_types else None

    def from_producer(self, tensor: str, op_types: set[str]) -> int | None:
        j = self.producer.get(tensor)
        return j if self.op(j) in op_types else None

    def scalar_other(self, i: int, tensor: str) -> bool:
        """The layer's inputs other than `tensor` are all scalars (constants like 0.5)."""
        others = [t for t in self.layers[i].inputs if t.name != tensor]
        return bool(others) and all(t.elements == 1 for t in others)

    def other_input(self, i: int, tensor: str) -> str:
        rest = [n for n in self.ins(i) if n != tensor]
        return rest[0] if rest else ""

    def closed(self, members: Sequence[int], sink: int) -> bool:
        """Every output of a non-sink member is consumed only inside the unit (and is no
        graph output)."""
        inside = set(members)
        return all(
            set(self.consumers.get(t.name, [])) <= inside and t.name not in self.graph_outputs
            for i in members if i != sink for t in self.layers[i].outputs
        )


Match = tuple[list[int], str] | None


def _conv_bn_act(ix: _Index, i: int) -> Match:
    if ix.op(i) not in ("Conv", "ConvTranspose"):
        return None
    members, pattern, last = [i], "conv", i
    bn = ix.consumer_of(i, {"BatchNormalization"})
    if bn is not None:
        members, pattern, last = [*members, bn], "conv_bn", bn
    for _ in range(2):  # a BN exported as Mul/Add by per-channel constants (onnxruntime folds them)
        affine = ix.consumer_of(last, {"Mul", "Add"})
        if affine is None or not _per_channel_constant(ix, affine, ix.out(last)):
            break
        members, last = [*members, affine], affine
        pattern = pattern if pattern.endswith("_affine") else pattern + "_affine"
    act = ix.consumer_of(last, ACTIVATIONS)
    if act is not None:
        members, pattern = [*members, act], pattern + "_act"
    return (members, pattern) if len(members) > 1 else None


def _per_channel_constant(ix: _Index, i: int, tensor: str) -> bool:
    """The layer combines `tensor` with a parameter smaller than it (a scale or shift per
    channel, or a scalar), the shape a conv can absorb into its weights and bias."""
    layer = ix.layers[i]
    other = [t for t in layer.inputs if t.name != tensor]
    produced = next((t for t in layer.inputs if t.name == tensor), None)
    return (len(other) == 1 and produced is not None and other[0].elements < produced.elements
            and (other[0].name in layer.parameter_inputs or _constant(ix, other[0].name)))


_CONSTANT_SOURCES = frozenset({"Constant", "ConstantOfShape"})
_RESHAPING = frozenset({"Unsqueeze", "Reshape", "Squeeze", "Identity", "Cast"})


def _constant(ix: _Index, tensor: str, depth: int = 4) -> bool:
    """Computed from constants only (structure-only exports make weights with ConstantOfShape);
    a per-sample scale such as a squeeze-excitation gate is data and does not fold."""
    j = ix.producer.get(tensor)
    if j is None or depth == 0:
        return False
    if ix.op(j) in _CONSTANT_SOURCES:
        return True
    return ix.op(j) in _RESHAPING and bool(ix.ins(j)) and _constant(ix, ix.ins(j)[0], depth - 1)


def _matmul_bias_act(ix: _Index, i: int) -> Match:
    if ix.op(i) not in ("MatMul", "Gemm"):
        return None
    members, pattern, last = [i], "matmul", i
    add = ix.consumer_of(i, {"Add"})
    if add is not None and ix.layers[add].parameter_inputs:
        members, pattern, last = [*members, add], "matmul_bias", add
    act = ix.consumer_of(last, ACTIVATIONS)
    if act is not None:
        members, pattern = [*members, act], pattern + "_act"
    return (members, pattern) if len(members) > 1 else None


def _gelu_tail(ix: _Index, x: str, core: list[int], last: int) -> Match:
    """… → Add(1) → Mul with x or with Mul(x, 0.5) [→ Mul(0.5)]: the common GELU ending."""
    plus = ix.consumer_of(last, {"Add"})
    if plus is None or not ix.scalar_other(plus, ix.out(last)):
        return None
    mul = ix.consumer_of(plus, {"Mul"})
    if mul is None:
        return None
    other = ix.other_input(mul, ix.out(plus))
    if other == x:
        half = ix.consumer_of(mul, {"Mul"})
        if half is None or not ix.scalar_other(half, ix.out(mul)):
            return None
        return [*core, plus, mul, half], "gelu"
    half = ix.from_producer(other, {"Mul"})
    if half is None or x not in ix.ins(half) or not ix.scalar_other(half, x):
        return None
    return [half, *core, plus, mul], "gelu"


def _gelu_erf(ix: _Index, i: int) -> Match:
    if ix.op(i) != "Erf":
        return None
    scale = ix.from_producer(ix.ins(i)[0], {"Div", "Mul"})
    if scale is None:
        return None
    x = ix.ins(scale)[0]
    if not ix.scalar_other(scale, x):
        return None
    return _gelu_tail(ix, x, [scale, i], i)


def _gelu_tanh(ix: _Index, i: int) -> Match:
    if ix.op(i) != "Tanh":
        return None
    scale = ix.from_producer(ix.ins(i)[0], {"Mul"})
    if scale is None:
        return None
    inner = next((ix.producer[n] for n in ix.ins(scale)
                  if ix.op(ix.producer.get(n)) == "Add"), None)
    if inner is None or not ix.scalar_other(scale, ix.out(inner)):
        return None
    cube_scale = next((ix.producer[n] for n in ix.ins(inner)
                       if ix.op(ix.producer.get(n)) == "Mul"), None)
    if cube_scale is None:
        return None
    x = ix.other_input(inner, ix.out(cube_scale))
    cube = next((ix.producer[n] for n in ix.ins(cube_scale)
                 if ix.op(ix.producer.get(n)) == "Pow"), None)
    if cube is None or ix.ins(cube)[0] != x:
        return None
    return _gelu_tail(ix, x, [cube, cube_scale, inner, scale, i], i)


def _layernorm(ix: _Index, i: int) -> Match:
    if ix.op(i) != "ReduceMean":
        return None
    x = ix.ins(i)[0]
    sub = ix.consumer_of(i, {"Sub"})
    if sub is None or ix.ins(sub) != [x, ix.out(i)]:
        return None
    users = ix.consumers.get(ix.out(sub), [])
    square = next((u for u in users if ix.op(u) == "Pow"
                   or (ix.op(u) == "Mul" and ix.ins(u) == [ix.out(sub)] * 2)), None)
    if square is None:
        return None
    members, last = [i, sub, square], square
    for op in ("ReduceMean", "Add", "Sqrt", "Div"):  # variance, + eps, sqrt, (x - mean) / std
        nxt = ix.consumer_of(last, {op})
        if nxt is None:
            return None
        members, last = [*members, nxt], nxt
    if last not in users:
        return None
    for op in ("Mul", "Add"):  # affine: gamma, then beta
        affine = ix.consumer_of(last, {op})
        if affine is None:
            break
        members, last = [*members, affine], affine
    return members, "layernorm"


def _softmax(ix: _Index, i: int) -> Match:
    if ix.op(i) != "Exp":
        return None
    members = [i]
    sub = ix.from_producer(ix.ins(i)[0], {"Sub"})
    if sub is not None:
        peak = ix.from_producer(ix.ins(sub)[1], {"ReduceMax"})
        if peak is not None and ix.ins(peak)[0] == ix.ins(sub)[0]:
            members = [peak, sub, i]
    users = ix.consumers.get(ix.out(i), [])
    total = next((u for u in users if ix.op(u) == "ReduceSum"), None)
    div = next((u for u in users if ix.op(u) == "Div"), None)
    if total is None or div is None or ix.ins(div) != [ix.out(i), ix.out(total)]:
        return None
    return [*members, total, div], "softmax"


def _scores_to_softmax(ix: _Index, i: int) -> list[int] | None:
    """An activation x activation MatMul, its scale, masks and the Softmax they feed."""
    if ix.op(i) != "MatMul" or ix.layers[i].parameter_inputs:
        return None
    members, last = [i], i
    scale = ix.consumer_of(i, {"Div", "Mul"})
    if scale is not None and ix.scalar_other(scale, ix.out(i)):
        members, last = [*members, scale], scale
    for _ in range(2):  # causal Where and/or additive mask, possibly a clamp (Max)
        mask = ix.consumer_of(last, {"Add", "Where", "Max"})
        if mask is None:
            break
        members, last = [*members, mask], mask
    soft = ix.consumer_of(last, {"Softmax"})
    return None if soft is None else [*members, soft]


def _attention_scores(ix: _Index, i: int) -> Match:
    members = _scores_to_softmax(ix, i)
    # A bare MatMul -> Softmax is left alone: only a scale or mask marks it as attention here.
    if members is None or len(members) < 3:
        return None
    return members, "attention_scores"


def _attention(ix: _Index, i: int) -> Match:
    """The whole attention core (what one SDPA kernel computes): the scores unit, a dropout
    of the probabilities, and the MatMul with V that consumes them. Exporters that decompose
    SDPA scale Q and K by sqrt(scale) each before the product; those Muls belong to it too."""
    members = _scores_to_softmax(ix, i)
    if members is None:
        return None
    last = members[-1]
    dropout = ix.consumer_of(last, {"Dropout"})
    if dropout is not None:
        members, last = [*members, dropout], dropout
    pv = ix.consumer_of(last, {"MatMul"})
    if pv is None or ix.layers[pv].parameter_inputs or ix.ins(pv)[0] != ix.out(last):
        return None
    pre_scales = [j for j in (ix.from_producer(t, {"Mul", "Div"}) for t in ix.ins(i))
                  if j is not None and ix.sole_consumer(j) == i
                  and ix.scalar_other(j, ix.ins(j)[0])]
    return [*pre_scales, *members, pv], "attention"


MATCHERS: tuple[Callable[[_Index, int], Match], ...] = (
    _layernorm, _softmax, _gelu_erf, _gelu_tanh, _attention, _attention_scores, _conv_bn_act,
    _matmul_bias_act,
)


def fuse(layers: Sequence[Layer], graph_outputs: frozenset[str] = frozenset()
         ) -> tuple[tuple[Layer, ...], tuple[FusionUnit, ...]]:
    """Layers with `unit` ids set, and the units in the order they were found; a tensor named
    in `graph_outputs` is read outside the graph, so no unit may hide it."""
    ix = _Index(layers, graph_outputs)
    unit_of: dict[int, str] = {}
    units: list[FusionUnit] = []
    for matcher in MATCHERS:
        for i in range(len(layers)):
            if i in unit_of:
                continue
            found = matcher(ix, i)
            if found is None:
                continue
            members, pattern = found
            ordered = sorted(set(members))
            if any(m in unit_of for m in ordered) or not ix.closed(ordered, max(ordered)):
                continue
            unit_id = f"u{len(units)}"
            units.append(FusionUnit(unit_id, pattern, tuple(layers[m].name for m in ordered)))
            unit_of.update(dict.fromkeys(ordered, unit_id))
    fused = tuple(
        dataclasses.replace(layer, unit=unit_of[i]) if i in unit_of else layer
        for i, layer in enumerate(layers)
    )
    return fused, tuple(units)
