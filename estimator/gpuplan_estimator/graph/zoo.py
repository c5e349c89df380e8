"""Structure-only transformer graphs from HuggingFace config JSON, without torch.

Each builder writes, op for op, what the HF PyTorch model runs in eager mode for one forward
pass in eval mode (dropout omitted): GPT-2 (`GPT2LMHeadModel`, also the GPT-3-style configs that
name it), BERT (`BertLMHeadModel`: no pooler, MLM head tied to the word embeddings) and OPT
(`OPTForCausalLM`). Weights are `ConstantOfShape` nodes (the `onnx.tools.replace_constants`
convention), so a graph of billions of parameters is a few MB. Input `input_ids[batch,
sequence]` is symbolic; bind it with `graph.load_model(batch=..., dim_bindings={"sequence": S})`.
The MoE `switch_transformers` family is not supported.

Linear layers run on the token matrix [batch·sequence, hidden] as one Gemm with bias, which is
what `torch.addmm` (HF `Conv1D`, `nn.Linear` on contiguous input) launches; the reshapes around
them are metadata-only, as in eager.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import DROPOUT_METADATA_KEY, KV_CACHE_METADATA_KEY
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM

OPSET = 20  # Gelu (erf form, BERT's single eager kernel) exists from opset 20
_FLOAT_MIN = float(np.finfo(np.float32).min)  # HF's mask value: torch.finfo(dtype).min


def load_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A HuggingFace config.json as a dict; errors name the file."""
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        raise errors.InvalidRequestError(os.fspath(path), f"cannot read config: {exc}") from exc
    if not isinstance(config, dict):
        raise errors.InvalidRequestError(os.fspath(path), "config is not a JSON object")
    return config


def _get(config: Mapping[str, Any], *keys: str, default: Any = None) -> Any:
    for key in keys:
        if config.get(key) is not None:
            return config[key]
    if default is not None:
        return default
    raise errors.InvalidRequestError(f"config.{keys[0]}", "missing")


class ZooGraphBuilder:
    """Accumulates nodes; every tensor is named after the node that produces it."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []

    def op(self, op_type: str, inputs: list[str], name: str, **attrs: Any) -> str:
        """A one-output node named `name`; its output's name."""
        self.nodes.append(helper.make_node(op_type, inputs, [name], name=name, **attrs))
        return name

    def ops(self, op_type: str, inputs: list[str], names: list[str], **attrs: Any) -> list[str]:
        """A node with several outputs; their names."""
        self.nodes.append(helper.make_node(op_type, inputs, names, name=names[0], **attrs))
        return names

    def weight(self, name: str, shape: list[int]) -> str:
        """A zero-filled weight of `shape`, made at run time (no initializer bytes)."""
        shape_name = self.ints(f"{name}__SHAPE", shape)
        value = helper.make_tensor("value", TensorProto.FLOAT, [1], [0.0])
        return self.op("ConstantOfShape", [shape_name], name, value=value)

    def ints(self, name: str, values: list[int], scalar: bool = False) -> str:
        """An int64 initializer (a scalar when `scalar`)."""
        dims = [] if scalar else [len(values)]
        self.initializers.append(helper.make_tensor(name, TensorProto.INT64, dims, values))
        return name

    def scalar(self, name: str, value: float) -> str:
        """A float32 scalar initializer."""
        self.initializers.append(helper.make_tensor(name, TensorProto.FLOAT, [], [value]))
        return name

    def linear(self, x: str, name: str, n_in: int, n_out: int, bias: bool = True) -> str:
        """x @ W (+ b) as one Gemm."""
        w = self.weight(f"{name}.weight", [n_in, n_out])
        inputs = [x, w, self.weight(f"{name}.bias", [n_out])] if bias else [x, w]
        return self.op("Gemm", inputs, name)

    def layer_norm(self, x: str, name: str, hidden: int, eps: float) -> str:
        """LayerNormalization over the last axis, with its weight and bias."""
        g = self.weight(f"{name}.weight", [hidden])
        b = self.weight(f"{name}.bias", [hidden])
        return self.op("LayerNormalization", [x, g, b], name, axis=-1, epsilon=eps)

    def activation(self, x: str, name: str, kind: str) -> str:
        """The config's activation function by its Hugging Face name."""
        if kind in ("gelu_new", "gelu_fast"):  # Python-level activations: eager kernels each
            return self.gelu_tanh(x, name)
        if kind == "gelu_pytorch_tanh":  # F.gelu(approximate="tanh"): one kernel, as hf_blocks
            return self.op("Gelu", [x], name, approximate="tanh")
        if kind == "gelu":
            return self.op("Gelu", [x], name)
        if kind == "relu":
            return self.op("Relu", [x], name)
        raise errors.InvalidRequestError("config.activation_function", f"unsupported {kind!r}")

    def gelu_tanh(self, x: str, name: str) -> str:
        """HF NewGELUActivation, 8 eager kernels:
        0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x**3)))."""
        half = self.op("Mul", [self.scalar(f"{name}.c_half", 0.5), x], f"{name}.half")
        cube = self.op("Pow", [x, self.scalar(f"{name}.c_three", 3.0)], f"{name}.pow")
        scaled = self.op("Mul", [self.scalar(f"{name}.c_coef", 0.044715), cube], f"{name}.mul")
        inner = self.op("Add", [x, scaled], f"{name}.add")
        arg = self.op("Mul", [self.scalar(f"{name}.c_sqrt", math.sqrt(2.0 / math.pi)), inner],
                      f"{name}.scale")
        tanh = self.op("Tanh", [arg], f"{name}.tanh")
        plus = self.op("Add", [self.scalar(f"{name}.c_one", 1.0), tanh], f"{name}.plus")
        return self.op("Mul", [half, plus], name)


class _Shapes:
    """Shape tensors shared by every layer (static: they cost nothing)."""

    def __init__(self, b: ZooGraphBuilder, heads: int, head_dim: int, vocab: int) -> None:
        self.bs = b.op("Shape", ["input_ids"], "shape.batch_seq")
        self.seq1 = b.op("Shape", ["input_ids"], "shape.seq1", start=1, end=2)
        self.heads = b.op("Concat", [self.bs, b.ints("c.heads", [heads, head_dim])],
                          "shape.heads", axis=0)
        self.logits = b.op("Concat", [self.bs, b.ints("c.vocab", [vocab])], "shape.logits",
                           axis=0)
        self.tokens = b.ints("c.tokens", [-1, heads * head_dim])

    def positions(self, b: ZooGraphBuilder) -> str:
        """position_ids = arange(seq)[None] as cumsum(ones) - 1 (static, and ONNX shape
        inference resolves it where a Range or Slice on a computed bound stays unknown)."""
        shape = b.op("Concat", [b.ints("c.one_list", [1]), self.seq1], "shape.one_seq", axis=0)
        ones = b.op("ConstantOfShape", [shape], "shape.position_ones",
                    value=helper.make_tensor("value", TensorProto.INT64, [1], [1]))
        count = b.op("CumSum", [ones, b.ints("c.axis1", [1], scalar=True)], "shape.cumsum")
        return b.op("Sub", [count, b.ints("c.one_i", [1], scalar=True)], "shape.position_ids")


def _split_heads(b: ZooGraphBuilder, x: str, shapes: _Shapes, name: str,
                 keys: bool = False) -> str:
    heads = b.op("Reshape", [x, shapes.heads], f"{name}.view")
    perm = [0, 2, 3, 1] if keys else [0, 2, 1, 3]  # keys pre-transposed for Q·Kᵀ
    return b.op("Transpose", [heads], f"{name}.permute", perm=perm)


def _merge_heads(b: ZooGraphBuilder, x: str, shapes: _Shapes, name: str) -> str:
    merged = b.op("Transpose", [x], f"{name}.permute", perm=[0, 2, 1, 3])
    return b.op("Reshape", [merged, shapes.tokens], f"{name}.view")


def uses_cache(config: Mapping[str, Any]) -> bool:
    """Whether a decoder's forward fills a key/value cache: its `use_cache`, which
    transformers' decoder and encoder-decoder configs default to true."""
    return bool(config.get("use_cache", True))


def has_dropout(config: Mapping[str, Any], key: str, default: float) -> bool:
    """Whether the config's dropout probability `key` (transformers' `default` when absent)
    is above 0: a training forward then keeps a mask per site."""
    return float(config.get(key, default) or 0.0) > 0.0


def _model(b: ZooGraphBuilder, name: str, logits: str, cache: Sequence[str] = (),
           dropout: Sequence[str] = ()) -> onnx.ModelProto:
    """The ONNX model of `b`'s nodes; `cache` names the tensors copied into a key/value cache
    (`KV_CACHE_METADATA_KEY`), `dropout` those dropout applies to in training
    (`DROPOUT_METADATA_KEY`)."""
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", SEQUENCE_DIM])
    out = helper.make_tensor_value_info(logits, TensorProto.FLOAT,
                                        ["batch", SEQUENCE_DIM, None])
    graph = helper.make_graph(b.nodes, name, [ids], [out], initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="gpuplan.zoo")
    name_tensors(model, KV_CACHE_METADATA_KEY, cache)
    name_tensors(model, DROPOUT_METADATA_KEY, dropout)
    return model


def name_tensors(model: onnx.ModelProto, key: str, names: Sequence[str]) -> None:
    """Add metadata `key` naming `names` (`KV_CACHE_METADATA_KEY`, `DROPOUT_METADATA_KEY`),
    if there are any."""
    if names:
        entry = model.metadata_props.add()
        entry.key, entry.value = key, ",".join(names)


def _attention_core(b: ZooGraphBuilder, q: str, k: str, v: str, shapes: _Shapes, name: str,
                    mask: Callable[[str], str]) -> str:
    """Q·Kᵀ → mask → softmax → ·V on [batch, heads, seq, head_dim]; returns token-major output."""
    qh = _split_heads(b, q, shapes, f"{name}.q")
    kh = _split_heads(b, k, shapes, f"{name}.k", keys=True)
    vh = _split_heads(b, v, shapes, f"{name}.v")
    scores = b.op("MatMul", [qh, kh], f"{name}.scores")
    probs = b.op("Softmax", [mask(scores)], f"{name}.softmax", axis=-1)
    context = b.op("MatMul", [probs, vh], f"{name}.context")
    return _merge_heads(b, context, shapes, f"{name}.merge")


def _build_gpt2(config: Mapping[str, Any], name: str) -> onnx.ModelProto:
    h, heads = int(_get(config, "n_embd")), int(_get(config, "n_head"))
    layers, vocab = int(_get(config, "n_layer")), int(_get(config, "vocab_size"))
    positions = int(_get(config, "n_positions", "n_ctx"))
    inner = int(_get(config, "n_inner", default=4 * h))
    eps = float(_get(config, "layer_norm_epsilon", default=1e-5))
    act = str(_get(config, "activation_function", default="gelu_new"))
    hd = h // heads
    b = ZooGraphBuilder()
    s = _Shapes(b, heads, hd, vocab)
    wte = b.weight("transformer.wte.weight", [vocab, h])
    tok = b.op("Gather", [wte, "input_ids"], "transformer.wte")
    pos = b.op("Gather", [b.weight("transformer.wpe.weight", [positions, h]),
                          s.positions(b)], "transformer.wpe")
    x = b.op("Reshape", [b.op("Add", [tok, pos], "transformer.embed"), s.tokens],
             "transformer.tokens")
    dropped = [x] if has_dropout(config, "embd_pdrop", 0.1) else []
    resid = has_dropout(config, "resid_pdrop", 0.1)
    # The causal `bias` buffer sliced to [.., :S, :S] is a view of a lower triangle: built
    # directly at [1, 1, S, S] (static, costs nothing, as the view in eager).
    square = b.op("Concat", [b.ints("c.one_one", [1, 1]), s.seq1, s.seq1], "shape.causal",
                  axis=0)
    ones = b.op("ConstantOfShape", [square], "attn.bias_ones",
                value=helper.make_tensor("value", TensorProto.BOOL, [1], [1]))
    causal = b.op("Trilu", [ones], "attn.causal", upper=0)
    masked = b.scalar("c.mask_value", _FLOAT_MIN)
    root = b.scalar("c.sqrt_head_dim", float(hd) ** 0.5)
    cache: list[str] = []
    for i in range(layers):
        p = f"transformer.h.{i}"

        def mask(scores: str, p: str = p) -> str:
            scaled = b.op("Div", [scores, root], f"{p}.attn.scale")
            return b.op("Where", [causal, scaled, masked], f"{p}.attn.causal_mask")

        y = b.layer_norm(x, f"{p}.ln_1", h, eps)
        qkv = b.linear(y, f"{p}.attn.c_attn", h, 3 * h)
        q, k, v = b.ops("Split", [qkv, b.ints(f"{p}.attn.split", [h, h, h])],
                        [f"{p}.attn.q", f"{p}.attn.k", f"{p}.attn.v"], axis=1)
        cache += [k, v]
        context = _attention_core(b, q, k, v, s, f"{p}.attn", mask)
        attn_out = b.linear(context, f"{p}.attn.c_proj", h, h)
        x = b.op("Add", [x, attn_out], f"{p}.residual_1")
        y = b.layer_norm(x, f"{p}.ln_2", h, eps)
        y = b.activation(b.linear(y, f"{p}.mlp.c_fc", h, inner), f"{p}.mlp.act", act)
        mlp_out = b.linear(y, f"{p}.mlp.c_proj", inner, h)
        x = b.op("Add", [x, mlp_out], f"{p}.residual_2")
        dropped += [attn_out, mlp_out] if resid else []
    x = b.layer_norm(x, "transformer.ln_f", h, eps)
    logits = b.op("Gemm", [x, wte], "lm_head", transB=1)  # tied to wte
    return _model(b, name, b.op("Reshape", [logits, s.logits], "logits"),
                  cache if uses_cache(config) else (), dropped)


def _build_bert(config: Mapping[str, Any], name: str) -> onnx.ModelProto:
    h, heads = int(_get(config, "hidden_size")), int(_get(config, "num_attention_heads"))
    layers, vocab = int(_get(config, "num_hidden_layers")), int(_get(config, "vocab_size"))
    inner, positions = int(_get(config, "intermediate_size")), int(
        _get(config, "max_position_embeddings"))
    types = int(_get(config, "type_vocab_size", default=2))
    eps = float(_get(config, "layer_norm_eps", default=1e-12))
    act = str(_get(config, "hidden_act", default="gelu"))
    hd = h // heads
    b = ZooGraphBuilder()
    s = _Shapes(b, heads, hd, vocab)
    word = b.weight("bert.embeddings.word_embeddings.weight", [vocab, h])
    zeros = b.op("ConstantOfShape", [s.bs], "bert.token_type_ids",
                 value=helper.make_tensor("value", TensorProto.INT64, [1], [0]))
    e = b.op("Add", [b.op("Gather", [word, "input_ids"], "bert.embeddings.word"),
                     b.op("Gather", [b.weight("bert.embeddings.token_type_embeddings.weight",
                                              [types, h]), zeros], "bert.embeddings.type")],
             "bert.embeddings.add_type")
    e = b.op("Add", [e, b.op("Gather", [b.weight("bert.embeddings.position_embeddings.weight",
                                                 [positions, h]), s.positions(b)],
                             "bert.embeddings.position")], "bert.embeddings.add_position")
    x = b.layer_norm(b.op("Reshape", [e, s.tokens], "bert.embeddings.tokens"),
                     "bert.embeddings.LayerNorm", h, eps)
    hidden = has_dropout(config, "hidden_dropout_prob", 0.1)
    dropped = [x] if hidden else []
    # get_extended_attention_mask on the default all-ones mask: (1 - m[:, None, None, :]) * min
    ones = b.op("ConstantOfShape", [s.bs], "bert.attention_mask",
                value=helper.make_tensor("value", TensorProto.FLOAT, [1], [1.0]))
    ext = b.op("Unsqueeze", [ones, b.ints("c.axes12", [1, 2])], "bert.mask.unsqueeze")
    ext = b.op("Sub", [b.scalar("c.one_f", 1.0), ext], "bert.mask.invert")
    ext = b.op("Mul", [ext, b.scalar("c.mask_value", _FLOAT_MIN)], "bert.extended_mask")
    root = b.scalar("c.sqrt_head_dim", float(hd) ** 0.5)
    for i in range(layers):
        p = f"bert.encoder.layer.{i}"

        def mask(scores: str, p: str = p) -> str:
            scaled = b.op("Div", [scores, root], f"{p}.attention.scale")
            return b.op("Add", [scaled, ext], f"{p}.attention.mask")

        q, k, v = (b.linear(x, f"{p}.attention.self.{n}", h, h) for n in ("query", "key", "value"))
        context = _attention_core(b, q, k, v, s, f"{p}.attention.self", mask)
        attn_out = b.linear(context, f"{p}.attention.output.dense", h, h)
        y = b.op("Add", [attn_out, x], f"{p}.attention.output.residual")
        x = b.layer_norm(y, f"{p}.attention.output.LayerNorm", h, eps)
        y = b.activation(b.linear(x, f"{p}.intermediate.dense", h, inner),
                         f"{p}.intermediate.act", act)
        ffn_out = b.linear(y, f"{p}.output.dense", inner, h)
        y = b.op("Add", [ffn_out, x], f"{p}.output.residual")
        dropped += [attn_out, ffn_out] if hidden else []
        x = b.layer_norm(y, f"{p}.output.LayerNorm", h, eps)
    t = b.activation(b.linear(x, "cls.predictions.transform.dense", h, h),
                     "cls.predictions.transform.act", act)
    t = b.layer_norm(t, "cls.predictions.transform.LayerNorm", h, eps)
    logits = b.op("Gemm", [t, word, b.weight("cls.predictions.bias", [vocab])],
                  "cls.predictions.decoder", transB=1)  # tied to the word embeddings
    return _model(b, name, b.op("Reshape", [logits, s.logits], "logits"), dropout=dropped)


_OPT_POSITION_OFFSET = 2  # OPTLearnedPositionalEmbedding reserves two rows


def _build_opt(config: Mapping[str, Any], name: str) -> onnx.ModelProto:
    h, heads = int(_get(config, "hidden_size")), int(_get(config, "num_attention_heads"))
    layers, vocab = int(_get(config, "num_hidden_layers")), int(_get(config, "vocab_size"))
    ffn, positions = int(_get(config, "ffn_dim")), int(_get(config, "max_position_embeddings"))
    proj = int(_get(config, "word_embed_proj_dim", default=h))
    pre_ln = bool(config.get("do_layer_norm_before", True))
    act = str(_get(config, "activation_function", default="relu"))
    hd = h // heads
    b = ZooGraphBuilder()
    s = _Shapes(b, heads, hd, vocab)
    embed = b.weight("model.decoder.embed_tokens.weight", [vocab, proj])
    x = b.op("Reshape", [b.op("Gather", [embed, "input_ids"], "model.decoder.embed_tokens"),
                         b.ints("c.proj_tokens", [-1, proj])], "model.decoder.tokens")
    if proj != h:
        x = b.linear(x, "model.decoder.project_in", proj, h, bias=False)
    # positions = (cumsum(mask) * mask - 1) + offset on the default all-ones mask (static)
    ones = b.op("ConstantOfShape", [s.bs], "model.attention_mask",
                value=helper.make_tensor("value", TensorProto.INT64, [1], [1]))
    pos = b.op("CumSum", [ones, b.ints("c.one_axis", [1], scalar=True)], "positions.cumsum")
    pos = b.op("Mul", [pos, ones], "positions.mul")
    pos = b.op("Add", [pos, b.ints("c.offset", [_OPT_POSITION_OFFSET - 1], scalar=True)],
               "positions.offset")
    pe = b.op("Gather", [b.weight("model.decoder.embed_positions.weight",
                                  [positions + _OPT_POSITION_OFFSET, h]), pos],
              "model.decoder.embed_positions")
    x = b.op("Add", [x, b.op("Reshape", [pe, s.tokens], "positions.tokens")],
             "model.decoder.embed")
    # _prepare_4d_causal_attention_mask: min above the diagonal, 0 elsewhere, [1, 1, S, S]
    square = b.op("Concat", [s.seq1, s.seq1], "shape.seq_seq", axis=0)
    full = b.op("ConstantOfShape", [square], "causal.full",
                value=helper.make_tensor("value", TensorProto.FLOAT, [1], [_FLOAT_MIN]))
    upper = b.op("Trilu", [full, b.ints("c.one_k", [1], scalar=True)], "causal.triu", upper=1)
    causal = b.op("Unsqueeze", [upper, b.ints("c.axes01", [0, 1])], "causal.mask")
    floor = b.scalar("c.mask_value", _FLOAT_MIN)
    scaling = b.scalar("c.scaling", float(hd) ** -0.5)
    residual_dropout = has_dropout(config, "dropout", 0.1)
    dropped: list[str] = []
    cache: list[str] = []
    for i in range(layers):
        p = f"model.decoder.layers.{i}"

        def mask(scores: str, p: str = p) -> str:
            added = b.op("Add", [scores, causal], f"{p}.self_attn.mask")
            return b.op("Max", [added, floor], f"{p}.self_attn.clamp")

        y = b.layer_norm(x, f"{p}.self_attn_layer_norm", h, 1e-5) if pre_ln else x
        q = b.op("Mul", [b.linear(y, f"{p}.self_attn.q_proj", h, h), scaling],
                 f"{p}.self_attn.q_scale")
        k, v = (b.linear(y, f"{p}.self_attn.{n}_proj", h, h) for n in ("k", "v"))
        cache += [k, v]
        context = _attention_core(b, q, k, v, s, f"{p}.self_attn", mask)
        attn_out = b.linear(context, f"{p}.self_attn.out_proj", h, h)
        x = b.op("Add", [x, attn_out], f"{p}.residual_1")
        if not pre_ln:
            x = b.layer_norm(x, f"{p}.self_attn_layer_norm", h, 1e-5)
        y = b.layer_norm(x, f"{p}.final_layer_norm", h, 1e-5) if pre_ln else x
        y = b.activation(b.linear(y, f"{p}.fc1", h, ffn), f"{p}.act", act)
        ffn_out = b.linear(y, f"{p}.fc2", ffn, h)
        x = b.op("Add", [x, ffn_out], f"{p}.residual_2")
        dropped += [attn_out, ffn_out] if residual_dropout else []
        if not pre_ln:
            x = b.layer_norm(x, f"{p}.final_layer_norm", h, 1e-5)
    if pre_ln:
        x = b.layer_norm(x, "model.decoder.final_layer_norm", h, 1e-5)
    if proj != h:
        x = b.linear(x, "model.decoder.project_out", h, proj, bias=False)
    logits = b.op("Gemm", [x, embed], "lm_head", transB=1)  # tied to embed_tokens
    return _model(b, name, b.op("Reshape", [logits, s.logits], "logits"),
                  cache if uses_cache(config) else (), dropped)


_BUILDERS: Mapping[str, Callable[[Mapping[str, Any], str], onnx.ModelProto]] = {
    "gpt2": _build_gpt2, "bert": _build_bert, "opt": _build_opt,
}
MODEL_TYPES: tuple[str, ...] = tuple(_BUILDERS)
"""The HF `model_type`s `build_transformer` writes."""


def build_transformer(config: Mapping[str, Any], *, name: str) -> onnx.ModelProto:
    """Structure-only ONNX model of a HF config (model_type gpt2, bert or opt)."""
    kind = str(config.get("model_type", ""))
    builder = _BUILDERS.get(kind)
    if builder is None:
        raise errors.InvalidRequestError(
            "config.model_type", f"{kind!r} not supported (supported: {', '.join(_BUILDERS)}; "
            "MoE switch_transformers is not modelled)")
    return builder(config, name)


def transformer_parameter_count(config: Mapping[str, Any]) -> int:
    """Closed-form trainable parameter count of the graph `build_transformer` writes."""
    kind = str(config.get("model_type", ""))
    if kind == "gpt2":
        h, layers = int(_get(config, "n_embd")), int(_get(config, "n_layer"))
        inner = int(_get(config, "n_inner", default=4 * h))
        per_layer = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + 2 * h * inner + inner + h
        embeddings = (int(_get(config, "vocab_size")) + int(_get(config, "n_positions"))) * h
        return embeddings + layers * per_layer + 2 * h
    if kind == "bert":
        h, layers = int(_get(config, "hidden_size")), int(_get(config, "num_hidden_layers"))
        inner, vocab = int(_get(config, "intermediate_size")), int(_get(config, "vocab_size"))
        rows = vocab + int(_get(config, "max_position_embeddings")) + int(
            _get(config, "type_vocab_size", default=2))
        per_layer = 4 * (h * h + h) + 2 * h * inner + inner + h + 4 * h
        head = h * h + h + 2 * h + vocab  # transform dense + LayerNorm + decoder bias
        return rows * h + 2 * h + layers * per_layer + head
    if kind == "opt":
        h, layers = int(_get(config, "hidden_size")), int(_get(config, "num_hidden_layers"))
        ffn, vocab = int(_get(config, "ffn_dim")), int(_get(config, "vocab_size"))
        proj = int(_get(config, "word_embed_proj_dim", default=h))
        per_layer = 4 * (h * h + h) + 2 * h * ffn + ffn + h + 4 * h
        positions = (int(_get(config, "max_position_embeddings")) + _OPT_POSITION_OFFSET) * h
        projections = 2 * proj * h if proj != h else 0
        final_ln = 2 * h if config.get("do_layer_norm_before", True) else 0
        return vocab * proj + positions + projections + layers * per_layer + final_ln
    raise errors.InvalidRequestError("config.model_type", f"{kind!r} not supported")
