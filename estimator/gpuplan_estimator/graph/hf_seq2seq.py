"""T5-shaped encoder-decoders from a Hugging Face config, block by block, without torch.

`build_t5` writes what `T5ForConditionalGeneration` runs in eager mode for one forward pass
(dropout omitted): the shared embedding; encoder blocks (RMS LayerNorm, self-attention with
the relative position bias of the stack's first layer added to unscaled scores, a ReLU or
gated-GELU feed-forward); decoder blocks (causal self-attention, cross-attention over the
encoder's output, feed-forward); the final norms and the head (tied: the embedding, after
scaling by d_model^-0.5). Inputs `input_ids` and `decoder_input_ids`, both
[batch, sequence], as the export path feeds them. Writer helpers are `hf_blocks`'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import TensorProto, helper

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import KV_CACHE_METADATA_KEY
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.graph import hf_blocks, zoo

MODEL_TYPES: tuple[str, ...] = ("t5",)
"""The HF `model_type`s `build_t5` writes."""

_get = hf_blocks._get


@dataclass(frozen=True)
class Seq2SeqShape:
    """Sizes of a T5-shaped model: the block sizes, both stacks' depths, the FFN kind."""

    block: hf_blocks.DecoderShape  # hidden, heads, head_dim (d_kv), d_ff, vocab, eps, tied
    encoder_layers: int
    decoder_layers: int
    buckets: int
    gated: bool  # gated-gelu (T5 v1.1, Flan-T5) rather than ReLU


def seq2seq_shape(config: Mapping[str, Any]) -> Seq2SeqShape:
    """The model a T5 config describes; errors name the config key."""
    heads, layers = int(_get(config, "num_heads")), int(_get(config, "num_layers"))
    proj = str(_get(config, "feed_forward_proj", default="relu"))
    if proj not in ("relu", "gated-gelu"):
        raise errors.InvalidRequestError("config.feed_forward_proj",
                                         f"unsupported {proj!r} (relu or gated-gelu)")
    block = hf_blocks.DecoderShape(
        hidden=int(_get(config, "d_model")), layers=layers, heads=heads, kv_heads=heads,
        head_dim=int(_get(config, "d_kv")), intermediate=int(_get(config, "d_ff")),
        vocab=int(_get(config, "vocab_size")),
        rms_eps=float(_get(config, "layer_norm_epsilon", default=1e-6)), activation="relu",
        tied_head=bool(config.get("tie_word_embeddings", True)), qkv_bias=False,
        mlp_bias=False, gemma=False)
    return Seq2SeqShape(
        block=block, encoder_layers=layers,
        decoder_layers=int(_get(config, "num_decoder_layers", default=layers)),
        buckets=int(_get(config, "relative_attention_num_buckets", default=32)),
        gated=proj == "gated-gelu")


def parameter_count(shape: Seq2SeqShape) -> int:
    """Closed-form trainable parameters of the graph `build_t5` writes."""
    b = shape.block
    h, inner = b.hidden, b.heads * b.head_dim
    ffn = (3 if shape.gated else 2) * h * b.intermediate
    encoder = shape.encoder_layers * (4 * h * inner + ffn + 2 * h)
    decoder = shape.decoder_layers * (8 * h * inner + ffn + 3 * h)
    head = 0 if b.tied_head else b.vocab * h
    return b.vocab * h + encoder + decoder + 2 * (shape.buckets * b.heads + h) + head


class _T5Writer:
    """One T5's nodes over `hf_blocks.BlockWriter`'s norm, linear and head reshapes."""

    def __init__(self, shape: Seq2SeqShape) -> None:
        self.s = shape
        self.w = hf_blocks.BlockWriter(shape.block)
        self.b = self.w.b

    def position_bias(self, stack: str, causal: bool) -> str:
        """The first layer's relative position bias, [1, heads, S, S] (plus the causal mask
        in the decoder), shared by every layer of the stack as in HF."""
        b, w, heads = self.b, self.w, self.s.block.heads
        buckets = b.op("Expand", [b.ints(f"{stack}.bucket_zero", [0], scalar=True),
                                  w.concat([w.seq1, w.seq1], f"{stack}.bucket_shape")],
                       f"{stack}.relative_position_bucket")
        table = b.weight(f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias"
                         ".weight", [self.s.buckets, heads])
        values = b.op("Gather", [table, buckets], f"{stack}.relative_attention_bias")
        bias = b.op("Unsqueeze", [b.op("Transpose", [values], f"{stack}.bias_heads",
                                       perm=[2, 0, 1]), b.ints(f"{stack}.bias_axis", [0])],
                    f"{stack}.position_bias")
        if causal:
            bias = b.op("Add", [bias, w.buffer([w.batch1, [1], w.seq1, w.seq1],
                                               f"{stack}.causal_mask")], f"{stack}.masked_bias")
        return bias

    def attention(self, x: str, memory: str, bias: str | None, name: str) -> str:
        """T5Attention: unscaled Q·Kᵀ, + bias, softmax, ·V, output projection."""
        blk, b, w = self.s.block, self.b, self.w
        inner = blk.heads * blk.head_dim
        q, k, v = (w.heads(w.linear(src, f"{name}.{p}", blk.hidden, inner), blk.heads,
                           f"{name}.{p}") for p, src in (("q", x), ("k", memory), ("v", memory)))
        if name.startswith("decoder."):  # its self- and cross-attention keys and values
            self.w.cache += [k, v]
        kt = b.op("Transpose", [k], f"{name}.kt", perm=[0, 1, 3, 2])
        scores = b.op("MatMul", [q, kt], f"{name}.scores")
        if bias is not None:
            scores = b.op("Add", [scores, bias], f"{name}.biased")
        probs = b.op("Softmax", [scores], f"{name}.softmax", axis=-1)
        context = b.op("MatMul", [probs, v], f"{name}.context")
        merged = b.op("Transpose", [context], f"{name}.merge", perm=[0, 2, 1, 3])
        merged = b.op("Reshape", [merged, w.concat([w.bs, [inner]], f"{name}.merge_shape")],
                      f"{name}.merge_view")
        return w.linear(merged, f"{name}.o", inner, blk.hidden)

    def feed_forward(self, x: str, name: str) -> str:
        blk, b, w = self.s.block, self.b, self.w
        h, f = blk.hidden, blk.intermediate
        if self.s.gated:
            gate = b.activation(w.linear(x, f"{name}.wi_0", h, f), f"{name}.act", "gelu_new")
            hidden = b.op("Mul", [gate, w.linear(x, f"{name}.wi_1", h, f)], f"{name}.mul")
        else:
            hidden = b.op("Relu", [w.linear(x, f"{name}.wi", h, f)], f"{name}.act")
        return w.linear(hidden, f"{name}.wo", f, h)

    def sublayer(self, x: str, name: str, body: Any) -> str:
        """Pre-norm residual: x + body(norm(x))."""
        return self.b.op("Add", [x, body(self.w.rms_norm(x, f"{name}.layer_norm"))],
                         f"{name}.residual")

    def stack(self, ids: str, embed: str, encoder_out: str | None, stack: str) -> str:
        b = self.b
        x = b.op("Gather", [embed, ids], f"{stack}.embed_tokens")
        bias = self.position_bias(stack, causal=encoder_out is not None)
        layers = self.s.encoder_layers if encoder_out is None else self.s.decoder_layers
        for i in range(layers):
            p = f"{stack}.block.{i}.layer"
            x = self.sublayer(x, f"{p}.0", lambda y, p=p: self.attention(
                y, y, bias, f"{p}.0.SelfAttention"))
            if encoder_out is not None:
                x = self.sublayer(x, f"{p}.1", lambda y, p=p: self.attention(
                    y, encoder_out, None, f"{p}.1.EncDecAttention"))
            ff = f"{p}.{1 if encoder_out is None else 2}"
            x = self.sublayer(x, ff, lambda y, ff=ff: self.feed_forward(y, f"{ff}.DenseReluDense"))
        return self.w.rms_norm(x, f"{stack}.final_layer_norm")


def build_t5(config: Mapping[str, Any], *, name: str) -> onnx.ModelProto:
    """Structure-only ONNX of a T5 config: encoder, decoder with cross-attention, head."""
    shape = seq2seq_shape(config)
    t5 = _T5Writer(shape)
    b, blk = t5.b, shape.block
    embed = b.weight("shared.weight", [blk.vocab, blk.hidden])
    memory = t5.stack("input_ids", embed, None, "encoder")
    x = t5.stack("decoder_input_ids", embed, memory, "decoder")
    if blk.tied_head:
        x = b.op("Mul", [x, b.scalar("c.head_scale", blk.hidden ** -0.5)], "decoder.head_scale")
        logits = b.op("MatMul", [x, b.op("Transpose", [embed], "lm_head.weight_t",
                                         perm=[1, 0])], "lm_head")
    else:
        logits = t5.w.linear(x, "lm_head", blk.hidden, blk.vocab)
    inputs = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", SEQUENCE_DIM])
              for n in ("input_ids", "decoder_input_ids")]
    out = helper.make_tensor_value_info(logits, TensorProto.FLOAT,
                                        ["batch", SEQUENCE_DIM, None])
    graph = helper.make_graph(b.nodes, name, inputs, [out], initializer=b.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", zoo.OPSET)],
                              producer_name="gpuplan.hf_seq2seq")
    zoo.name_tensors(model, KV_CACHE_METADATA_KEY, t5.w.cache if zoo.uses_cache(config) else ())
    return model
