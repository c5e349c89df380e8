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


_SCORE_PASS_THROUGH = frozenset({"Cast", "CastLike", "Reshape", "Identity"})
"""Ops between the scores product and the Softmax (or the probabilities and ·V) that move or
cast the matrix without computing on it: a fused kernel does them for free."""
_SCORE_DEPTH = 8
"""Most ops between the scores product and its Softmax (scale, casts, reshapes, masks) and
between the probabilities and ·V (cast, NaN guard, dropout); exports write 0 to 4."""


def _score_inputs(ix: _Index, j: int) -> list[str]:
    """The inputs of `j` that may carry the scores towards the Softmax: the matrix of a cast or
    reshape, of a scale by a scalar, of a mask (added, clamped or selected by Where)."""
    op, ins = ix.op(j), ix.ins(j)
    if op in _SCORE_PASS_THROUGH:
        return ins[:1]
    if op == "Div":
        return ins[:1] if len(ins) == 2 and ix.scalar_other(j, ins[0]) else []
    if op == "Mul":
        return [t for t in ins if ix.scalar_other(j, t)]
    if op in ("Add", "Max", "Min"):
        return ins
    if op == "Where":
        return ins[1:]
    return []


def _back_to_scores(ix: _Index, tensor: str, sink: int, depth: int) -> list[int] | None:
    """The activation x activation MatMul that `tensor` (read only by `sink`) comes from, and
    the ops between them, in data order; None when `tensor` is something else."""
    j = ix.producer.get(tensor)
    if j is None or ix.sole_consumer(j) != sink:
        return None
    if ix.op(j) == "MatMul":
        return None if ix.layers[j].parameter_inputs else [j]
    if depth == 0:
        return None
    for t in _score_inputs(ix, j):  # a mask may sit on either side of an Add
        found = _back_to_scores(ix, t, j, depth - 1)
        if found is not None:
            return [*found, j]
    return None


def _scores_to_softmax(ix: _Index, i: int) -> list[int] | None:
    """A Softmax, the activation x activation MatMul of its scores and whatever scales, masks,
    casts or reshapes lie between them: [scores, ..., softmax]."""
    if ix.op(i) != "Softmax" or not ix.ins(i):
        return None
    found = _back_to_scores(ix, ix.ins(i)[0], i, _SCORE_DEPTH)
    return None if found is None else [*found, i]


def _attention_scores(ix: _Index, i: int) -> Match:
    members = _scores_to_softmax(ix, i)
    # A bare MatMul -> Softmax is left alone: only a scale or mask marks it as attention here.
    if members is None or len(members) < 3:
        return None
    return members, "attention_scores"


def _nan_guard(ix: _Index, probs: int) -> list[int] | None:
    """Where(IsNaN(p), 0, p): the guard torch.onnx writes after an SDPA's Softmax so that a
    fully masked row gives zeros, not NaN. [IsNaN, Where] when `probs` feeds only that."""
    users = ix.consumers.get(ix.out(probs), [])
    isnan = next((u for u in users if ix.op(u) == "IsNaN"), None)
    where = next((u for u in users if ix.op(u) == "Where"), None)
    if isnan is None or where is None or len(users) != 2 or ix.sole_consumer(isnan) != where:
        return None
    if ix.ins(where)[0] != ix.out(isnan) or not _fills(ix, where, ix.out(probs)):
        return None
    return [isnan, where]


def _fills(ix: _Index, where: int, tensor: str) -> bool:
    """`where` keeps `tensor` or puts a scalar (0, -inf) in its place: a masked fill."""
    cond, *branches = ix.layers[where].inputs
    names = [t.name for t in branches]
    return len(names) == 2 and tensor in names and tensor != cond.name and \
        branches[1 - names.index(tensor)].elements == 1


def _to_context(ix: _Index, soft: int) -> list[int] | None:
    """From the probabilities to the MatMul with V: casts, a NaN guard, a masked fill, a
    dropout, then the product. [..., context] or None."""
    members: list[int] = []
    last = soft
    for _ in range(_SCORE_DEPTH):
        guard = _nan_guard(ix, last)
        if guard is not None:
            members, last = [*members, *guard], guard[-1]
            continue
        j = ix.sole_consumer(last)
        if j is None:
            return None
        first = ix.ins(j)[0] == ix.out(last)
        if ix.op(j) == "MatMul":
            return [*members, j] if first and not ix.layers[j].parameter_inputs else None
        fill = ix.op(j) == "Where" and _fills(ix, j, ix.out(last))
        if not (fill or (first and ix.op(j) in _SCORE_PASS_THROUGH | {"Dropout"})):
            return None
        members, last = [*members, j], j
    return None


def _input_scale(ix: _Index, tensor: str, product: int) -> list[int]:
    """The scale by a scalar applied to one operand of the scores product (Q, or Kᵀ before or
    after its transpose), with that transpose. A scale further back (OPT scales the query
    projection's output before splitting heads) is an op of its own in eager PyTorch too."""
    j = ix.producer.get(tensor)
    between: list[int] = []
    if j is not None and ix.op(j) == "Transpose" and ix.sole_consumer(j) == product:
        between, product, j = [j], j, ix.producer.get(ix.ins(j)[0])
    if j is None or ix.op(j) not in ("Mul", "Div") or ix.sole_consumer(j) != product or \
            not _score_inputs(ix, j):
        return []
    return [j, *between]


def _attention(ix: _Index, i: int) -> Match:
    """The whole attention core (what one SDPA kernel computes) around a Softmax: its scores
    product with any scale, mask, cast or reshape before it; a NaN guard, cast or dropout of the
    probabilities; the MatMul with V that consumes them. Exporters that decompose SDPA scale Q
    and Kᵀ by sqrt(scale) each before the product (a constant, or computed in the graph as
    Sqrt(CastLike(...))); those Muls and the transposes between them and the product belong to
    it too."""
    members = _scores_to_softmax(ix, i)
    if members is None:
        return None
    tail = _to_context(ix, i)
    if tail is None:
        return None
    scores = members[0]
    pre_scales = [j for t in ix.ins(scores) for j in _input_scale(ix, t, scores)]
    return [*pre_scales, *members, *tail], "attention"


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
