"""Today's decoder families from a Hugging Face config, one block written and repeated N times.

`build_decoder` writes the structure-only ONNX of a Llama-shaped causal LM (Llama, Mistral,
Qwen2, Gemma: grouped-query attention, rotary positions, SwiGLU or GeGLU MLP, RMSNorm, tied or
untied head) and of its mixture-of-experts variants (Mixtral, Qwen2-MoE), without torch and
without exporting: the block is written once per layer from the config, so a 70B config takes
well under a second. Node for node it is what torch.onnx's dynamo exporter writes for the
eager model with `attn_implementation="sdpa"` (the math kernel: scale, Q·Kᵀ, additive mask,
softmax, NaN guard, ·V), so the shortcut prices exactly like the full export
(tests/unit/estimator/graph/test_hf_blocks.py compares them on configs small enough to
export). Weights are `ConstantOfShape` of their PyTorch shape ([out, in], transposed as the
exporter does); the rotary tables and the causal mask are input-free buffers (`Expand` of a
scalar), as the exporter's folded constants are.

Mixture of experts: the router (a linear layer to E logits, softmax, top-k) sends each token to
k experts. The experts' FFNs run as one batched matmul over [E, C, hidden], C =
ceil(tokens·k·capacity_factor / E) rows each: every token runs k experts' FFNs, which is what
the FLOPs are, and all E experts' weights are held. capacity_factor is the config's
`capacity_factor` (Switch-style routing) or 1.0, the dropless average load (Mixtral,
Qwen2-MoE); an unbalanced router's slowest expert is not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx

from gpuplan_estimator.core import errors
from gpuplan_estimator.graph import zoo

# zoo's config reader, node writer and model wrapper are shared by both config writers (one
# package, one convention for structure-only graphs).
_get = zoo._get

@dataclass(frozen=True)
class DecoderShape:
    """What one decoder block of a config is: sizes, attention layout and MLP kind."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rms_eps: float
    activation: str  # "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    tied_head: bool
    qkv_bias: bool
    mlp_bias: bool  # Llama's `mlp_bias`: gate/up/down projections with biases
    gemma: bool  # embeddings scaled by sqrt(hidden), RMSNorm weight applied as (1 + w)
    experts: int = 0  # 0: a dense MLP
    top_k: int = 0
    expert_intermediate: int = 0
    capacity_factor: float = 1.0
    shared_intermediate: int = 0  # Qwen2-MoE's shared expert (0: none)
    normalize_top_k: bool = True


DENSE_TYPES = ("llama", "mistral", "qwen2", "gemma")
MOE_TYPES = ("mixtral", "qwen2_moe")
MODEL_TYPES: tuple[str, ...] = DENSE_TYPES + MOE_TYPES
"""The HF `model_type`s `build_decoder` writes."""

_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                "gelu_tanh": "gelu_tanh", "gelu": "gelu_tanh"}


def decoder_shape(config: Mapping[str, Any]) -> DecoderShape:
    """The block a config describes; errors name the config key."""
    kind = str(config.get("model_type", ""))
    if kind not in MODEL_TYPES:
        raise errors.InvalidRequestError("config.model_type", f"{kind!r} is not a decoder "
                                         f"family written here ({', '.join(MODEL_TYPES)})")
    hidden, heads = int(_get(config, "hidden_size")), int(_get(config, "num_attention_heads"))
    act_name = str(_get(config, "hidden_activation", "hidden_act", default="silu"))
    if act_name not in _ACTIVATIONS:
        raise errors.InvalidRequestError("config.hidden_act", f"unsupported {act_name!r}")
    moe = kind in MOE_TYPES
    return DecoderShape(
        hidden=hidden, layers=int(_get(config, "num_hidden_layers")), heads=heads,
        kv_heads=int(_get(config, "num_key_value_heads", default=heads)),
        head_dim=int(_get(config, "head_dim", default=hidden // heads)),
        intermediate=int(_get(config, "intermediate_size")),
        vocab=int(_get(config, "vocab_size")),
        rms_eps=float(_get(config, "rms_norm_eps", default=1e-6)),
        activation=_ACTIVATIONS[act_name],
        tied_head=bool(config.get("tie_word_embeddings", kind == "gemma")),
        qkv_bias=kind in ("qwen2", "qwen2_moe") or bool(config.get("attention_bias", False)),
        mlp_bias=bool(config.get("mlp_bias", False)),
        gemma=kind == "gemma",
        experts=int(_get(config, "num_local_experts", "num_experts")) if moe else 0,
        top_k=int(_get(config, "num_experts_per_tok")) if moe else 0,
        expert_intermediate=int(_get(config, "moe_intermediate_size", "intermediate_size"))
        if moe else 0,
        capacity_factor=float(_get(config, "capacity_factor", default=1.0)),
        shared_intermediate=int(config.get("shared_expert_intermediate_size") or 0),
        normalize_top_k=bool(config.get("norm_topk_prob", kind == "mixtral")))


def parameter_count(shape: DecoderShape) -> int:
    """Closed-form trainable parameters of the graph `build_decoder` writes."""
    h, hd = shape.hidden, shape.head_dim
    attention = h * hd * (2 * shape.heads + 2 * shape.kv_heads)
    if shape.qkv_bias:
        attention += hd * (shape.heads + 2 * shape.kv_heads)
    if shape.experts:
        mlp = h * shape.experts + 3 * shape.experts * h * shape.expert_intermediate
        if shape.shared_intermediate:
            mlp += 3 * h * shape.shared_intermediate + h
    else:
        mlp = 3 * h * shape.intermediate
        if shape.mlp_bias:
            mlp += 2 * shape.intermediate + h
    head = 0 if shape.tied_head else shape.vocab * h
    return shape.vocab * h + shape.layers * (attention + mlp + 2 * h) + h + head


class BlockWriter:
    """Writes one decoder's nodes: a `zoo` builder plus the shapes every block shares, those
    of the token ids `ids` [batch, sequence]."""

    def __init__(self, shape: DecoderShape, ids: str = "input_ids") -> None:
        self.s = shape
        self.b = zoo.ZooGraphBuilder()
        b = self.b
        self.bs = b.op("Shape", [ids], "shape.batch_seq")
        self.seq1 = b.op("Shape", [ids], "shape.seq1", start=1, end=2)
        self.batch1 = b.op("Shape", [ids], "shape.batch1", start=0, end=1)
        self.tokens = b.op("ReduceProd", [self.bs], "shape.tokens", keepdims=1)
        self.zero = b.scalar("c.zero", 0.0)
        self.cache: list[str] = []
        """Each attention's keys (rotated) and values, as its key/value cache copies them."""

    def concat(self, parts: list[str | list[int]], name: str) -> str:
        """A shape vector from computed pieces and constants."""
        ins = [p if isinstance(p, str) else self.b.ints(f"{name}.c{i}", p)
               for i, p in enumerate(parts)]
        return self.b.op("Concat", ins, name, axis=0)

    def buffer(self, parts: list[str | list[int]], name: str) -> str:
        """An input-free float tensor of a computed shape (rotary table, causal mask): a
        buffer, as the exporter's folded constants are, never a weight."""
        return self.b.op("Expand", [self.zero, self.concat(parts, f"{name}.shape")], name)

    def linear(self, x: str, name: str, n_in: int, n_out: int, bias: bool = False) -> str:
        """nn.Linear as dynamo writes it: MatMul by the transposed [out, in] weight."""
        w = self.b.weight(f"{name}.weight", [n_out, n_in])
        y = self.b.op("MatMul", [x, self.b.op("Transpose", [w], f"{name}.weight_t",
                                                perm=[1, 0])], name)
        if bias:
            y = self.b.op("Add", [y, self.b.weight(f"{name}.bias", [n_out])], f"{name}.add")
        return y

    def rms_norm(self, x: str, name: str) -> str:
        """RMSNorm as exported: x·rsqrt(mean(x²) + eps), times the weight."""
        b = self.b
        sq = b.op("Pow", [x, b.scalar(f"{name}.two", 2.0)], f"{name}.pow")
        mean = b.op("ReduceMean", [sq, b.ints(f"{name}.axes", [-1])], f"{name}.mean",
                    keepdims=1)
        var = b.op("Add", [mean, b.scalar(f"{name}.eps", self.s.rms_eps)], f"{name}.add_eps")
        inv = b.op("Reciprocal", [b.op("Sqrt", [var], f"{name}.sqrt")], f"{name}.rsqrt")
        normed = b.op("Mul", [x, inv], f"{name}.normed")
        w = b.weight(f"{name}.weight", [self.s.hidden])
        if self.s.gemma:  # Gemma's RMSNorm scales by (1 + weight)
            w = b.op("Add", [w, b.scalar(f"{name}.one", 1.0)], f"{name}.one_plus")
        return b.op("Mul", [w, normed], name)

    def heads(self, x: str, count: int, name: str) -> str:
        """[batch, seq, count·head_dim] → [batch, count, seq, head_dim]."""
        shape = self.concat([self.bs, [count, self.s.head_dim]], f"{name}.view_shape")
        view = self.b.op("Reshape", [x, shape], f"{name}.view")
        return self.b.op("Transpose", [view], f"{name}.transpose", perm=[0, 2, 1, 3])

    def rotary(self, x: str, cos: str, sin: str, name: str) -> str:
        """x·cos + rotate_half(x)·sin, rotate_half = cat(-x2, x1)."""
        b, half = self.b, self.s.head_dim // 2
        by_cos = b.op("Mul", [x, cos], f"{name}.cos")
        lo = b.op("Slice", [x, b.ints(f"{name}.s0", [0]), b.ints(f"{name}.e0", [half]),
                            b.ints(f"{name}.ax0", [3])], f"{name}.x1")
        hi = b.op("Slice", [x, b.ints(f"{name}.s1", [half]),
                            b.ints(f"{name}.e1", [self.s.head_dim]),
                            b.ints(f"{name}.ax1", [3])], f"{name}.x2")
        rotated = b.op("Concat", [b.op("Neg", [hi], f"{name}.neg"), lo], f"{name}.cat",
                       axis=-1)
        return b.op("Add", [by_cos, b.op("Mul", [rotated, sin], f"{name}.sin")], name)

    def repeat_kv(self, x: str, name: str) -> str:
        """HF repeat_kv: [b, kv, s, d] → [b, heads, s, d] (nothing when kv == heads)."""
        rep = self.s.heads // self.s.kv_heads
        if rep == 1:
            return x
        b = self.b
        wide = b.op("Unsqueeze", [x, b.ints(f"{name}.axis", [2])], f"{name}.unsqueeze")
        shape = self.concat([self.batch1, [self.s.kv_heads, rep], self.seq1,
                             [self.s.head_dim]], f"{name}.expand_shape")
        clone = b.op("Identity", [b.op("Expand", [wide, shape], f"{name}.expand")],
                     f"{name}.clone")
        return b.op("Reshape", [clone, self.concat([self.batch1, [self.s.heads], self.seq1,
                                                    [self.s.head_dim]], f"{name}.shape")],
                    f"{name}.view")

    def attention_core(self, q: str, k: str, v: str, mask: str, name: str) -> str:
        """SDPA's math kernel as exported: q and kᵀ each scaled by sqrt(scale), Q·Kᵀ, the
        additive mask, softmax, the NaN guard, ·V."""
        b, d = self.b, self.s.head_dim
        scale = b.op("CastLike", [b.scalar(f"{name}.scale", 1.0 / math.sqrt(d)), q],
                     f"{name}.scale_like")
        flat = b.op("Reshape", [k, self.concat([[-1], self.seq1, [d]], f"{name}.k3_shape")],
                    f"{name}.k3")
        kt = b.op("Transpose", [flat], f"{name}.kt", perm=[0, 2, 1])
        kt = b.op("Reshape", [kt, self.concat([self.batch1, [self.s.heads, d], self.seq1],
                                              f"{name}.kt_shape")], f"{name}.kt4")
        qs = b.op("Mul", [q, b.op("Sqrt", [scale], f"{name}.sqrt_q")], f"{name}.q_scaled")
        ks = b.op("Mul", [kt, b.op("Sqrt", [scale], f"{name}.sqrt_k")], f"{name}.k_scaled")
        scores = b.op("Add", [b.op("MatMul", [qs, ks], f"{name}.scores"), mask],
                      f"{name}.masked")
        probs = b.op("Softmax", [scores], f"{name}.softmax", axis=-1)
        nan = b.op("IsNaN", [probs], f"{name}.isnan")
        probs = b.op("Where", [nan, self.zero, probs], f"{name}.nan_guard")
        return b.op("MatMul", [probs, v], f"{name}.context")

    def attention(self, x: str, rope: tuple[str, str], mask: str, name: str) -> str:
        """Self-attention: q/k/v projections, RoPE on q and k, GQA repeat, SDPA, o_proj."""
        s, b = self.s, self.b
        q, k, v = (self.heads(self.linear(x, f"{name}.{p}_proj", s.hidden, n * s.head_dim,
                                          bias=s.qkv_bias), n, f"{name}.{p}")
                   for p, n in (("q", s.heads), ("k", s.kv_heads), ("v", s.kv_heads)))
        q, k = (self.rotary(t, *rope, f"{name}.{p}_rot") for t, p in ((q, "q"), (k, "k")))
        self.cache += [k, v]
        context = self.attention_core(q, self.repeat_kv(k, f"{name}.k_rep"),
                                      self.repeat_kv(v, f"{name}.v_rep"), mask, name)
        merged = b.op("Identity", [b.op("Transpose", [context], f"{name}.merge",
                                        perm=[0, 2, 1, 3])], f"{name}.merge_clone")
        merged = b.op("Reshape", [merged, self.concat([self.bs, [s.heads * s.head_dim]],
                                                      f"{name}.merge_shape")],
                      f"{name}.merge_view")
        return self.linear(merged, f"{name}.o_proj", s.heads * s.head_dim, s.hidden)

    def act(self, x: str, name: str) -> str:
        """The gate's activation: SiLU as x·sigmoid(x) (as exported), or tanh-GELU."""
        if self.s.activation == "gelu_tanh":
            return self.b.op("Gelu", [x], name, approximate="tanh")
        return self.b.op("Mul", [x, self.b.op("Sigmoid", [x], f"{name}.sigmoid")], name)

    def mlp(self, x: str, name: str, inner: int) -> str:
        """Gated MLP: down(act(gate(x)) · up(x))."""
        h, bias = self.s.hidden, self.s.mlp_bias and not self.s.experts
        gate = self.act(self.linear(x, f"{name}.gate_proj", h, inner, bias), f"{name}.act")
        up = self.linear(x, f"{name}.up_proj", h, inner, bias)
        return self.linear(self.b.op("Mul", [gate, up], f"{name}.mul"), f"{name}.down_proj",
                           inner, h, bias)

    def moe(self, x: str, name: str) -> str:
        """Router, top-k, dispatch of C rows to each of E experts, the experts' gated MLPs
        as batched matmuls, weighting and the scatter-add back to the tokens."""
        s, b = self.s, self.b
        e, f, h = s.experts, s.expert_intermediate, s.hidden
        flat = b.op("Reshape", [x, b.ints(f"{name}.flat_shape", [-1, h])], f"{name}.flat")
        probs = b.op("Softmax", [self.linear(flat, f"{name}.gate", h, e)],
                     f"{name}.router_softmax", axis=-1)
        weights, _ = b.ops("TopK", [probs, b.ints(f"{name}.k", [s.top_k])],
                           [f"{name}.top_weights", f"{name}.top_experts"], axis=-1)
        if s.normalize_top_k:
            total = b.op("ReduceSum", [weights, b.ints(f"{name}.sum_axes", [-1])],
                         f"{name}.top_sum", keepdims=1)
            weights = b.op("Div", [weights, total], f"{name}.top_norm")
        den = 1000  # capacity_factor as a fraction: the row count is integer shape arithmetic
        routed = b.op("Mul", [self.tokens, b.ints(f"{name}.k_cf", [round(
            s.top_k * s.capacity_factor * den)])], f"{name}.routed")
        rows = b.op("Div", [b.op("Add", [routed, b.ints(f"{name}.round", [e * den - 1])],
                                 f"{name}.routed_up"), b.ints(f"{name}.per", [e * den])],
                    f"{name}.capacity")
        index = b.op("Expand", [b.ints(f"{name}.zero_i", [0], scalar=True),
                                self.concat([[e], rows], f"{name}.index_shape")],
                     f"{name}.dispatch_index")
        tokens = b.op("Gather", [flat, index], f"{name}.dispatch", axis=0)
        w_gate, w_up = (b.weight(f"{name}.experts.{p}", [e, h, f]) for p in ("w1", "w3"))
        hidden = b.op("Mul", [self.act(b.op("MatMul", [tokens, w_gate], f"{name}.experts.gate"),
                                       f"{name}.experts.act"),
                              b.op("MatMul", [tokens, w_up], f"{name}.experts.up")],
                      f"{name}.experts.mul")
        out = b.op("MatMul", [hidden, b.weight(f"{name}.experts.w2", [e, f, h])],
                   f"{name}.experts.down")
        flat_w = b.op("Reshape", [weights, b.ints(f"{name}.w_shape", [-1])], f"{name}.w_flat")
        gathered = b.op("Gather", [flat_w, index], f"{name}.route_weight", axis=0)
        out = b.op("Mul", [out, b.op("Unsqueeze", [gathered, b.ints(f"{name}.w_axis", [-1])],
                                     f"{name}.route_weight3")], f"{name}.weighted")
        zeros = self.buffer([self.tokens, [h]], f"{name}.zeros")
        where = b.op("Unsqueeze", [index, b.ints(f"{name}.i_axis", [-1])], f"{name}.index3")
        combined = b.op("ScatterND", [zeros, where, out], f"{name}.combine", reduction="add")
        if s.shared_intermediate:
            shared = self.mlp(flat, f"{name}.shared_expert", s.shared_intermediate)
            gate = b.op("Sigmoid", [self.linear(flat, f"{name}.shared_expert_gate", h, 1)],
                        f"{name}.shared_gate")
            combined = b.op("Add", [combined, b.op("Mul", [gate, shared],
                                                   f"{name}.shared_gated")],
                            f"{name}.shared_add")
        return b.op("Reshape", [combined, self.concat([self.bs, [h]], f"{name}.out_shape")],
                    f"{name}.out")

    def block(self, x: str, rope: tuple[str, str], mask: str, i: int) -> str:
        """Decoder layer `i`: pre-norm attention and MLP (or MoE), each with its residual."""
        p = f"model.layers.{i}"
        y = self.attention(self.rms_norm(x, f"{p}.input_layernorm"), rope, mask,
                           f"{p}.self_attn")
        x = self.b.op("Add", [x, y], f"{p}.residual_1")
        y = self.rms_norm(x, f"{p}.post_attention_layernorm")
        y = (self.moe(y, f"{p}.block_sparse_moe") if self.s.experts
             else self.mlp(y, f"{p}.mlp", self.s.intermediate))
        return self.b.op("Add", [x, y], f"{p}.residual_2")


def build_decoder(config: Mapping[str, Any], *, name: str) -> onnx.ModelProto:
    """Structure-only ONNX of a Llama-shaped (or MoE) causal LM config: embeddings, the block
    written once per layer, final norm and head; input `input_ids[batch, sequence]`."""
    shape = decoder_shape(config)
    if shape.heads % shape.kv_heads or shape.head_dim % 2:
        raise errors.InvalidRequestError(
            "config.num_key_value_heads", f"{shape.heads} heads over {shape.kv_heads} key/value "
            f"heads of dim {shape.head_dim}: heads must divide evenly, head_dim be even")
    d = BlockWriter(shape)
    b = d.b
    embed = b.weight("model.embed_tokens.weight", [shape.vocab, shape.hidden])
    x = b.op("Gather", [embed, "input_ids"], "model.embed_tokens")
    if shape.gemma:
        x = b.op("Mul", [x, b.scalar("c.normalizer", math.sqrt(shape.hidden))],
                 "model.embed_scale")
    rope = (d.buffer([[1, 1], d.seq1, [shape.head_dim]], "model.rotary_emb.cos"),
            d.buffer([[1, 1], d.seq1, [shape.head_dim]], "model.rotary_emb.sin"))
    mask = d.buffer([d.batch1, [1], d.seq1, d.seq1], "model.causal_mask")
    for i in range(shape.layers):
        x = d.block(x, rope, mask, i)
    x = b.op("Identity", [d.rms_norm(x, "model.norm")], "model.norm.alias")
    if shape.tied_head:
        head_w = b.op("Transpose", [embed], "lm_head.weight_t", perm=[1, 0])
        logits = b.op("MatMul", [x, head_w], "lm_head")
    else:
        logits = d.linear(x, "lm_head", shape.hidden, shape.vocab)
    return zoo._model(b, name, logits, d.cache if zoo.uses_cache(config) else ())

