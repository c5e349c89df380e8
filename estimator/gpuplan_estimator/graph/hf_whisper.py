"""Whisper (speech encoder-decoder) from a Hugging Face config, layer by layer, without torch.

`build_whisper` writes what `WhisperForConditionalGeneration` runs in eager mode for one
training forward pass (dropout and LayerDrop omitted), in the order and with the kernels
torch.onnx's dynamo exporter writes for it (`attn_implementation="sdpa"`, its math kernel):

- the audio front end: two Conv1d (kernel 3, padding 1; stride 1 then 2), each followed by
  GELU, over `input_features[batch, num_mel_bins, 2·max_source_positions]` (3000 mel frames:
  30 s of audio), then the learned position table (`max_source_positions` rows) added;
- encoder layers: pre-LayerNorm self-attention (q/v/out projections with bias, k without; q
  scaled by head_dim^-0.5 before SDPA runs at scale 1) and a GELU feed-forward;
- decoder layers over `decoder_input_ids[batch, sequence]`: token and learned position
  embeddings, causal self-attention, cross-attention whose keys and values are the encoder's
  output, the feed-forward; the final LayerNorms and the head tied to the token embedding.

The audio length is fixed by the config (HF refuses any other); the decoder's length is the
`sequence` dim (`--dim sequence=N`), at most `max_target_positions` (448 for every OpenAI
checkpoint), the rows of its position table. Both position tables are weights, as in HF (which
freezes the encoder's: its ~0.1 % of the parameters is priced with gradients and optimizer
state here, as the export prices it).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import onnx
from onnx import TensorProto, helper

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.graph import hf_blocks, loading, zoo

MODEL_TYPES: tuple[str, ...] = ("whisper",)
"""The HF `model_type`s `build_whisper` writes."""

AUDIO_INPUT = "input_features"
DECODER_INPUT = "decoder_input_ids"
_CONV_STRIDES = (1, 2)  # conv1, conv2: 2·max_source_positions frames → max_source_positions
_LAYER_NORM_EPS = 1e-5  # nn.LayerNorm's default, which every Whisper LayerNorm uses

_get = zoo._get


@dataclass(frozen=True)
class WhisperShape:
    """Sizes of a Whisper config: width, both stacks, the audio and text lengths."""

    hidden: int  # d_model
    encoder_layers: int
    decoder_layers: int
    encoder_heads: int
    decoder_heads: int
    encoder_ffn: int
    decoder_ffn: int
    vocab: int
    mel_bins: int
    source_positions: int  # encoder positions (after the stride-2 conv)
    target_positions: int  # decoder position-table rows: the longest decoder sequence
    activation: str  # the feed-forward's HF activation name
    tied_head: bool

    @property
    def mel_frames(self) -> int:
        """The audio input's length: 2 · max_source_positions (3000 frames, 30 s)."""
        return self.source_positions * _CONV_STRIDES[0] * _CONV_STRIDES[1]


def whisper_shape(config: Mapping[str, Any]) -> WhisperShape:
    """The model a Whisper config describes; errors name the config key."""
    hidden = int(_get(config, "d_model"))
    shape = WhisperShape(
        hidden=hidden, encoder_layers=int(_get(config, "encoder_layers")),
        decoder_layers=int(_get(config, "decoder_layers")),
        encoder_heads=int(_get(config, "encoder_attention_heads")),
        decoder_heads=int(_get(config, "decoder_attention_heads")),
        encoder_ffn=int(_get(config, "encoder_ffn_dim")),
        decoder_ffn=int(_get(config, "decoder_ffn_dim")),
        vocab=int(_get(config, "vocab_size")), mel_bins=int(_get(config, "num_mel_bins")),
        source_positions=int(_get(config, "max_source_positions", default=1500)),
        target_positions=int(_get(config, "max_target_positions", default=448)),
        activation=str(_get(config, "activation_function", default="gelu")),
        tied_head=bool(config.get("tie_word_embeddings", True)))
    for key, heads in (("encoder_attention_heads", shape.encoder_heads),
                       ("decoder_attention_heads", shape.decoder_heads)):
        if heads < 1 or hidden % heads:
            raise errors.InvalidRequestError(f"config.{key}", f"{heads} heads do not divide "
                                             f"d_model {hidden}")
    sizes = {k: getattr(shape, f) for k, f in (
        ("d_model", "hidden"), ("encoder_layers", "encoder_layers"),
        ("decoder_layers", "decoder_layers"), ("encoder_ffn_dim", "encoder_ffn"),
        ("decoder_ffn_dim", "decoder_ffn"), ("vocab_size", "vocab"),
        ("num_mel_bins", "mel_bins"), ("max_source_positions", "source_positions"),
        ("max_target_positions", "target_positions"))}
    for key, value in sizes.items():
        if value < 1:
            raise errors.InvalidRequestError(f"config.{key}", f"{value}: must be positive")
    return shape


def check_request(config: Mapping[str, Any], *, batch: int | None, sequence: int | None,
                  label: str) -> None:
    """Refuse, before anything is written, a decoder length the model cannot run (none, or
    beyond its position table) and a size whose largest attention scores exceed the cap on
    any tensor (`loading.MAX_TENSOR_ELEMENTS`). Fields are the request's, as
    `exporting.check_hf_request`'s."""
    shape = whisper_shape(config)
    if sequence is None:
        raise errors.InvalidRequestError(
            "dim_bindings.sequence", f"{label}: give the decoder's length in tokens (--dim "
            f"sequence=N, at most {shape.target_positions}); the audio is the config's "
            f"{shape.mel_frames} mel frames")
    if not 1 <= sequence <= shape.target_positions:
        raise errors.InvalidRequestError(
            "dim_bindings.sequence", f"{label}: decoder sequence {sequence}: Whisper's "
            f"position table has {shape.target_positions} rows (config.max_target_positions); "
            f"give 1..{shape.target_positions}")
    heads = max(shape.encoder_heads, shape.decoder_heads)
    scores = (batch or 1) * heads * max(shape.source_positions, sequence) ** 2
    if scores > loading.MAX_TENSOR_ELEMENTS:
        raise errors.InvalidRequestError(
            "batch", f"{label}: batch {batch or 1}: one layer's attention scores over "
            f"{shape.source_positions} audio positions are {scores:.2e} elements, beyond the "
            f"{loading.MAX_TENSOR_ELEMENTS:.2e}-element cap on any tensor")


def parameter_count(shape: WhisperShape) -> int:
    """Closed-form parameters of the graph `build_whisper` writes (= HF's count)."""
    h = shape.hidden
    attention = 4 * h * h + 3 * h  # q, k, v, out; biases on q, v and out
    def ffn(f: int) -> int:
        return 2 * h * f + f + h
    convs = (shape.mel_bins * 3 * h + h) + (h * 3 * h + h)
    encoder = (convs + shape.source_positions * h + 2 * h
               + shape.encoder_layers * (attention + ffn(shape.encoder_ffn) + 4 * h))
    decoder = ((shape.vocab + shape.target_positions) * h + 2 * h
               + shape.decoder_layers * (2 * attention + ffn(shape.decoder_ffn) + 6 * h))
    return encoder + decoder + (0 if shape.tied_head else shape.vocab * h)


class _WhisperWriter:
    """One Whisper's nodes over `hf_blocks.BlockWriter`'s shape vectors and linear layers
    (its batch and sequence are the decoder's `decoder_input_ids`)."""

    def __init__(self, shape: WhisperShape) -> None:
        self.s = shape
        self.w = hf_blocks.BlockWriter(hf_blocks.DecoderShape(
            hidden=shape.hidden, layers=shape.decoder_layers, heads=shape.decoder_heads,
            kv_heads=shape.decoder_heads, head_dim=shape.hidden // shape.decoder_heads,
            intermediate=shape.decoder_ffn, vocab=shape.vocab, rms_eps=_LAYER_NORM_EPS,
            activation=shape.activation, tied_head=shape.tied_head, qkv_bias=True,
            mlp_bias=True, gemma=False), ids=DECODER_INPUT)
        self.b = self.w.b
        self.one = self.b.scalar("c.sdpa_scale", 1.0)  # SDPA's scale: q is pre-scaled

    def layer_norm(self, x: str, name: str) -> str:
        return self.b.layer_norm(x, name, self.s.hidden, _LAYER_NORM_EPS)

    def heads(self, x: str, seq: list[str | list[int]], count: int, name: str) -> str:
        """[batch, seq, hidden] → [batch, count, seq, head_dim], copied (`.contiguous()`)."""
        view = self.b.op("Reshape", [x, self.w.concat(
            [self.w.batch1, *seq, [count, self.s.hidden // count]], f"{name}.view_shape")],
            f"{name}.view")
        return self.b.op("Identity", [self.b.op("Transpose", [view], f"{name}.transpose",
                                                perm=[0, 2, 1, 3])], f"{name}.clone")

    def sdpa(self, q: str, k: str, v: str, kv_seq: list[str | list[int]], heads: int,
             mask: str | None, name: str) -> str:
        """SDPA's math kernel as exported at scale 1: √scale on q and on kᵀ, Q·Kᵀ, (the
        additive mask, softmax, the NaN guard) or softmax, ·V. Without a mask the exporter
        casts kᵀ's factor once more (one scalar CastLike)."""
        b, w, d = self.b, self.w, self.s.hidden // heads
        scale = b.op("CastLike", [self.one, q], f"{name}.scale_like")
        flat = b.op("Reshape", [k, w.concat([[-1], *kv_seq, [d]], f"{name}.k3_shape")],
                    f"{name}.k3")
        kt = b.op("Transpose", [flat], f"{name}.kt", perm=[0, 2, 1])
        kt = b.op("Reshape", [kt, w.concat([w.batch1, [heads, d], *kv_seq],
                                           f"{name}.kt_shape")], f"{name}.kt4")
        qs = b.op("Mul", [q, b.op("Sqrt", [scale], f"{name}.sqrt_q")], f"{name}.q_scaled")
        k_factor = b.op("Sqrt", [scale], f"{name}.sqrt_k")
        if mask is None:
            k_factor = b.op("CastLike", [k_factor, kt], f"{name}.sqrt_k_like")
        scores = b.op("MatMul", [qs, b.op("Mul", [kt, k_factor], f"{name}.k_scaled")],
                      f"{name}.scores")
        if mask is None:
            return b.op("MatMul", [b.op("Softmax", [scores], f"{name}.softmax", axis=-1), v],
                        f"{name}.context")
        probs = b.op("Softmax", [b.op("Add", [scores, mask], f"{name}.masked")],
                     f"{name}.softmax", axis=-1)
        nan = b.op("IsNaN", [probs], f"{name}.isnan")
        probs = b.op("Where", [nan, self.w.zero, probs], f"{name}.nan_guard")
        return b.op("MatMul", [probs, v], f"{name}.context")

    def attention(self, x: str, memory: str, seqs: tuple[list[str | list[int]], ...],
                  heads: int, mask: str | None, name: str) -> str:
        """WhisperAttention: q (bias, ·head_dim^-0.5) from x, k (no bias) and v (bias) from
        `memory`, SDPA, out_proj (bias). `seqs`: x's and memory's sequence-length parts."""
        h, w = self.s.hidden, self.w
        q = w.linear(x, f"{name}.q_proj", h, h, bias=True)
        q = self.b.op("Mul", [q, self.b.scalar(f"{name}.scaling", (h // heads) ** -0.5)],
                      f"{name}.q_scaled_in")
        q = self.heads(q, seqs[0], heads, f"{name}.q")
        k = self.heads(w.linear(memory, f"{name}.k_proj", h, h), seqs[1], heads, f"{name}.k")
        v = self.heads(w.linear(memory, f"{name}.v_proj", h, h, bias=True), seqs[1], heads,
                       f"{name}.v")
        context = self.sdpa(q, k, v, seqs[1], heads, mask, name)
        merged = self.b.op("Identity", [self.b.op("Transpose", [context], f"{name}.merge",
                                                  perm=[0, 2, 1, 3])], f"{name}.merge_clone")
        merged = self.b.op("Reshape", [merged, w.concat([w.batch1, *seqs[0], [h]],
                                                        f"{name}.merge_shape")],
                           f"{name}.merge_view")
        return w.linear(merged, f"{name}.out_proj", h, h, bias=True)

    def attention_sublayer(self, x: str, memory: str | None,
                           seqs: tuple[list[str | list[int]], ...], heads: int,
                           mask: str | None, layer: str, kind: str) -> str:
        """x + attention(LayerNorm(x)): self-attention (`memory` None) or cross-attention over
        `memory`; `kind` names the HF module (self_attn, encoder_attn)."""
        y = self.layer_norm(x, f"{layer}.{kind}_layer_norm")
        y = self.attention(y, y if memory is None else memory, seqs, heads, mask,
                           f"{layer}.{kind}")
        return self.b.op("Add", [x, y], f"{layer}.{kind}_residual")

    def feed_forward(self, x: str, inner: int, name: str) -> str:
        """x + fc2(act(fc1(LayerNorm(x)))), both linears with bias."""
        h, w = self.s.hidden, self.w
        y = w.linear(self.layer_norm(x, f"{name}.final_layer_norm"), f"{name}.fc1", h, inner,
                     bias=True)
        y = w.linear(self.b.activation(y, f"{name}.activation_fn", self.s.activation),
                     f"{name}.fc2", inner, h, bias=True)
        return self.b.op("Add", [x, y], f"{name}.residual_ffn")

    def encoder(self) -> str:
        """Convs, positions, the layers, the final LayerNorm: [batch, positions, hidden]."""
        s, b = self.s, self.b
        x = AUDIO_INPUT
        for i, (stride, n_in) in enumerate(zip(_CONV_STRIDES, (s.mel_bins, s.hidden),
                                               strict=True), start=1):
            p = f"model.encoder.conv{i}"
            x = b.op("Conv", [x, b.weight(f"{p}.weight", [s.hidden, n_in, 3]),
                              b.weight(f"{p}.bias", [s.hidden])], p, kernel_shape=[3],
                     pads=[1, 1], strides=[stride], dilations=[1], group=1)
            x = b.op("Gelu", [x], f"{p}.gelu")
        x = b.op("Transpose", [x], "model.encoder.permute", perm=[0, 2, 1])
        table = b.weight("model.encoder.embed_positions.weight", [s.source_positions, s.hidden])
        positions = b.op("Gather", [table, b.ints("c.encoder_positions",
                                                  list(range(s.source_positions)))],
                         "model.encoder.embed_positions", axis=0)
        x = b.op("Add", [x, positions], "model.encoder.add_positions")
        seq: list[str | list[int]] = [[s.source_positions]]
        for i in range(s.encoder_layers):
            p = f"model.encoder.layers.{i}"
            x = self.attention_sublayer(x, None, (seq, seq), s.encoder_heads, None, p,
                                        "self_attn")
            x = self.feed_forward(x, s.encoder_ffn, p)
        return self.layer_norm(x, "model.encoder.layer_norm")

    def decoder(self, embed: str, memory: str) -> str:
        """Token and position embeddings, the layers, the final LayerNorm."""
        s, b, w = self.s, self.b, self.w
        x = b.op("Gather", [embed, DECODER_INPUT], "model.decoder.embed_tokens", axis=0)
        table = b.op("Transpose", [b.weight("model.decoder.embed_positions.weight",
                                            [s.target_positions, s.hidden])],
                     "model.decoder.embed_positions.weight_view", perm=[0, 1])
        index = b.op("Expand", [b.ints("c.position_zero", [0], scalar=True),
                                w.concat([w.bs, [1]], "model.decoder.position_ids_shape")],
                     "model.decoder.position_ids")
        positions = b.op("Transpose", [b.op("GatherND", [table, index],
                                            "model.decoder.embed_positions")],
                         "model.decoder.positions", perm=[0, 1, 2])
        x = b.op("Add", [x, positions], "model.decoder.add_positions")
        mask = w.buffer([w.batch1, [1], w.seq1, w.seq1], "model.decoder.causal_mask")
        text: list[str | list[int]] = [w.seq1]
        audio: list[str | list[int]] = [[s.source_positions]]
        for i in range(s.decoder_layers):
            p = f"model.decoder.layers.{i}"
            x = self.attention_sublayer(x, None, (text, text), s.decoder_heads, mask, p,
                                        "self_attn")
            x = self.attention_sublayer(x, memory, (text, audio), s.decoder_heads, None, p,
                                        "encoder_attn")
            x = self.feed_forward(x, s.decoder_ffn, p)
        return self.layer_norm(x, "model.decoder.layer_norm")


def build_whisper(config: Mapping[str, Any], *, name: str) -> onnx.ModelProto:
    """Structure-only ONNX of a Whisper config: inputs `input_features[batch, num_mel_bins,
    2·max_source_positions]` and `decoder_input_ids[batch, sequence]`, output the logits
    [batch, sequence, vocab]."""
    shape = whisper_shape(config)
    writer = _WhisperWriter(shape)
    b = writer.b
    memory = writer.encoder()
    embed = b.weight("model.decoder.embed_tokens.weight", [shape.vocab, shape.hidden])
    x = writer.decoder(embed, memory)
    if shape.tied_head:
        logits = b.op("MatMul", [x, b.op("Transpose", [embed], "proj_out.weight_t",
                                         perm=[1, 0])], "proj_out")
    else:
        logits = writer.w.linear(x, "proj_out", shape.hidden, shape.vocab)
    inputs = [helper.make_tensor_value_info(AUDIO_INPUT, TensorProto.FLOAT,
                                            ["batch", shape.mel_bins, shape.mel_frames]),
              helper.make_tensor_value_info(DECODER_INPUT, TensorProto.INT64,
                                            ["batch", SEQUENCE_DIM])]
    out = helper.make_tensor_value_info(logits, TensorProto.FLOAT,
                                        ["batch", SEQUENCE_DIM, shape.vocab])
    graph = helper.make_graph(b.nodes, name, inputs, [out], initializer=b.initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", zoo.OPSET)],
                             producer_name="gpuplan.hf_whisper")
