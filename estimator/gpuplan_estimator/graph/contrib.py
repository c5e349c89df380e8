"""Pure: onnxruntime's com.microsoft transformer ops — output shapes and what they compute.

onnx's shape inference has no schema for these ops (Optimum and onnxruntime's transformer
optimizer write them), so everything downstream of one would lose its shape. `output_shapes`
gives each output's shape from the input shapes and attributes, following the operator
documentation of onnxruntime (docs/ContribOperators.md); `attention_parts` says which GEMMs
and softmax a fused attention runs, so it is priced as what it computes. An input layout
these rules do not cover is an error naming the node, never a guess.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuplan_estimator.core import errors

Shape = tuple[int, ...]

SAME_SHAPE_OPS = frozenset({"FastGelu", "BiasGelu", "Gelu", "QuickGelu", "BiasAdd",
                            "RotaryEmbedding"})
"""Output 0 has the shape of input 0."""
SKIP_NORM_OPS = frozenset({"SkipLayerNormalization", "SkipSimplifiedLayerNormalization"})
ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})
KNOWN_OPS = SAME_SHAPE_OPS | SKIP_NORM_OPS | ATTENTION_OPS


@dataclass(frozen=True)
class AttentionParts:
    """What a fused attention computes: an optional input projection (x @ W), then per head
    Q·Kᵀ (batch × heads × query × key), softmax over keys, and probs·V."""

    batch: int
    heads: int
    query_length: int
    key_length: int
    qk_head_size: int
    v_head_size: int
    projection: tuple[Shape, Shape] | None  # (x, W) of the packed QKV projection

    @property
    def output_shape(self) -> Shape:
        """[batch, query length, heads × value head size]."""
        return (self.batch, self.query_length, self.heads * self.v_head_size)


def output_shapes(op_type: str, inputs: Sequence[Shape | None], attributes: Mapping[str, Any],
                  outputs: int, where: str) -> list[Shape | None]:
    """Shape of each output (None for ones the rules leave to the consumer, such as KV
    caches); `inputs` holds None for absent or unknown inputs."""
    first = inputs[0] if inputs else None
    if first is None:
        return [None] * outputs
    if op_type in SAME_SHAPE_OPS:
        return [first] + [None] * (outputs - 1)
    if op_type in SKIP_NORM_OPS:  # output, mean, inv_std_var, input_skip_bias_sum
        stats = (*first[:-1], 1)
        return [first, stats, stats, first][:outputs] + [None] * max(0, outputs - 4)
    if op_type in ATTENTION_OPS:
        return [attention_parts(op_type, inputs, attributes, where).output_shape] + [
            None] * (outputs - 1)
    return [None] * outputs


def attention_parts(op_type: str, inputs: Sequence[Shape | None],
                    attributes: Mapping[str, Any], where: str) -> AttentionParts:
    """The GEMM shapes of a com.microsoft attention node."""
    heads = _positive(attributes, "num_heads", where)
    padded = [*inputs, *([None] * 3)]
    if op_type == "Attention":
        return _packed_attention(padded[0], padded[1], heads, attributes, where)
    if op_type == "MultiHeadAttention":
        return _multi_head(padded[0], padded[1], padded[2], heads, where)
    kv_heads = _positive(attributes, "kv_num_heads", where)
    return _grouped_query(padded[0], padded[1], heads, kv_heads, where)


def _positive(attributes: Mapping[str, Any], key: str, where: str) -> int:
    value = attributes.get(key)
    if not isinstance(value, int) or value < 1:
        raise errors.InvalidModelError(f"{where}: attribute {key} = {value!r}, needs an int >= 1")
    return value


def _divide(total: int, parts: int, what: str, where: str) -> int:
    if parts < 1 or total % parts:
        raise errors.InvalidModelError(f"{where}: {what} {total} does not split into {parts}")
    return total // parts


def _packed_attention(x: Shape | None, w: Shape | None, heads: int,
                      attributes: Mapping[str, Any], where: str) -> AttentionParts:
    if x is None or w is None or len(x) != 3 or len(w) != 2 or w[0] != x[2]:
        raise errors.InvalidModelError(
            f"{where}: Attention needs input [batch, sequence, hidden] and weights "
            f"[hidden, q+k+v], got {x} and {w}")
    sizes = attributes.get("qkv_hidden_sizes")
    if isinstance(sizes, list) and len(sizes) == 3 and all(isinstance(s, int) for s in sizes):
        q_hidden, _, v_hidden = sizes
    else:
        q_hidden = v_hidden = _divide(w[1], 3, "packed QKV width", where)
    return AttentionParts(batch=x[0], heads=heads, query_length=x[1], key_length=x[1],
                          qk_head_size=_divide(q_hidden, heads, "query hidden", where),
                          v_head_size=_divide(v_hidden, heads, "value hidden", where),
                          projection=(x, w))


def _multi_head(q: Shape | None, k: Shape | None, v: Shape | None, heads: int,
                where: str) -> AttentionParts:
    if q is None or len(q) not in (3, 5):
        raise errors.InvalidModelError(f"{where}: query of shape {q}, expected rank 3 or 5")
    if len(q) == 5:  # packed QKV [batch, sequence, heads, 3, head]
        return AttentionParts(q[0], heads, q[1], q[1], q[4], q[4], None)
    head = _divide(q[2], heads, "query hidden", where)
    if k is None:
        return AttentionParts(q[0], heads, q[1], q[1], head, head, None)
    key_length = k[1] if len(k) == 3 else k[2] if len(k) == 4 else None
    if key_length is None:
        raise errors.InvalidModelError(f"{where}: key of shape {k}, expected rank 3 or 4")
    v_head = head if v is None else (
        _divide(v[2], heads, "value hidden", where) if len(v) == 3 else v[3])
    return AttentionParts(q[0], heads, q[1], key_length, head, v_head, None)


def _grouped_query(q: Shape | None, k: Shape | None, heads: int, kv_heads: int,
                   where: str) -> AttentionParts:
    if q is None or len(q) != 3:
        raise errors.InvalidModelError(f"{where}: query of shape {q}, expected rank 3")
    if k is None:  # packed [batch, sequence, (heads + 2·kv_heads)·head]
        head = _divide(q[2], heads + 2 * kv_heads, "packed QKV width", where)
        return AttentionParts(q[0], heads, q[1], q[1], head, head, None)
    head = _divide(q[2], heads, "query hidden", where)
    key_length = k[1] if len(k) == 3 else k[2] if len(k) == 4 else q[1]
    return AttentionParts(q[0], heads, q[1], key_length, head, head, None)
