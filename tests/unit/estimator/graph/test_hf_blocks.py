"""hf_blocks: today's decoder families written block by block from a Hugging Face config,
priced like the full torch export, with closed-form parameter counts that match publications."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gpuplan_estimator import graph
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import ModelGraph, OpFamily
from gpuplan_estimator.graph import exporting, hf_blocks, hf_seq2seq, zoo
from gpuplan_testing import export_parity

CONFIGS = Path(zoo.__file__).parent.parent / "data" / "model_configs"
TINY_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
              "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
              "intermediate_size": 160, "vocab_size": 128}
TINY_MIXTRAL = {"model_type": "mixtral", "hidden_size": 64, "num_attention_heads": 4,
                "num_key_value_heads": 2, "num_hidden_layers": 2, "intermediate_size": 96,
                "vocab_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2}


def load(config: dict[str, object], batch: int = 2, sequence: int = 16) -> ModelGraph:
    data = hf_blocks.build_decoder(config, name="m").SerializeToString()
    return graph.load_model(data, batch=batch, dim_bindings={"sequence": sequence})


# Published sizes (Hugging Face model cards / safetensors index): Llama-2-7B 6,738,415,616;
# Llama-2-70B 68,976,648,192; Mixtral-8x7B 46,702,792,704.
@pytest.mark.parametrize(("name", "published"), [
    ("llama2_7b", 6_738_415_616), ("llama2_70b", 68_976_648_192),
    ("mixtral_8x7b", 46_702_792_704)])
def test_closed_form_count_matches_the_published_size(name: str, published: int) -> None:
    shape = hf_blocks.decoder_shape(zoo.load_hf_config(CONFIGS / f"{name}.json"))
    assert hf_blocks.parameter_count(shape) == published


@pytest.mark.parametrize("config", [
    TINY_LLAMA,
    {**TINY_LLAMA, "model_type": "qwen2", "num_key_value_heads": 4, "tie_word_embeddings": True},
    {**TINY_LLAMA, "model_type": "gemma", "head_dim": 32, "hidden_act": "gelu_pytorch_tanh"},
    {**TINY_LLAMA, "model_type": "mistral"},
    {**TINY_LLAMA, "mlp_bias": True, "attention_bias": True},
    TINY_MIXTRAL,
    {**TINY_MIXTRAL, "model_type": "qwen2_moe", "num_experts": 8, "num_local_experts": None,
     "num_experts_per_tok": 4, "moe_intermediate_size": 32,
     "shared_expert_intermediate_size": 128},
])
def test_every_family_loads_with_its_closed_form_count(config: dict[str, object]) -> None:
    g = load(config)
    assert g.parameter_count == hf_blocks.parameter_count(hf_blocks.decoder_shape(config))
    assert g.unknown_op_types == ()
    assert g.layers[-1].outputs[0].shape == (2, 16, 128)


def test_experts_run_top_k_ffns_per_token_and_all_experts_are_held() -> None:
    """Each of the batch·sequence tokens runs top-k experts' gated MLPs (3 matmuls of
    hidden x expert_intermediate); every expert's weights count as parameters."""
    def expert_flops(g: ModelGraph) -> int:
        return sum(ly.flops for ly in g.layers if ".experts." in ly.name
                   and ly.family is OpFamily.MATMUL)

    tokens, h, f = 2 * 16, 64, 96
    top2, top4 = load(TINY_MIXTRAL), load({**TINY_MIXTRAL, "num_experts_per_tok": 4})
    assert expert_flops(top2) == 2 * (2 * tokens * 2 * 3 * h * f)  # two layers
    assert expert_flops(top4) == 2 * expert_flops(top2)
    assert top4.parameter_count == top2.parameter_count
    more = load({**TINY_MIXTRAL, "num_local_experts": 8})
    assert more.parameter_count - top2.parameter_count == 2 * (4 * 3 * h * f + 4 * h)
    # a capacity factor pads every expert's rows: 1.25 x the routed tokens, rounded up
    padded = load({**TINY_MIXTRAL, "capacity_factor": 1.25})
    assert expert_flops(padded) == 2 * (2 * 4 * 20 * 3 * h * f)  # ceil(32·2·1.25/4) = 20 rows


def test_a_70b_config_writes_and_loads_in_seconds() -> None:
    config = zoo.load_hf_config(CONFIGS / "llama2_70b.json")
    g = graph.load_model(hf_blocks.build_decoder(config, name="70b").SerializeToString(),
                         batch=1, dim_bindings={"sequence": 4096})
    assert g.parameter_count == 68_976_648_192
    assert Counter(u.pattern for u in g.units)["attention"] == 80


def test_bad_head_layouts_name_the_key() -> None:
    with pytest.raises(errors.InvalidRequestError, match="num_key_value_heads"):
        hf_blocks.build_decoder({**TINY_LLAMA, "num_key_value_heads": 3}, name="bad")
    with pytest.raises(errors.InvalidRequestError, match=r"config\.hidden_size"):
        hf_blocks.build_decoder({"model_type": "llama"}, name="bad")


def test_the_shortcut_prices_like_the_full_export() -> None:
    """The block written from the config against transformers' LlamaForCausalLM built on the
    meta device and exported by torch.onnx (dynamo): the same kernels, layer for layer (op,
    FLOPs, bytes, parameters), hence the same GPU time to the last digit, and the same
    weights, gradients and optimizer state.

    Two figures differ, by the export's bookkeeping, not by what trains: the host timeline
    charges every graph node one eager dispatch, and the export carries ~170 more nodes per
    model (its folded shape arithmetic) than the written graph, so host time differs
    (host-bound tiny models only); and the live-tensor peak differs by the input-free
    rotary/mask buffers the export holds as constants (16 KiB here, < 0.01 % of the total).
    """
    pytest.importorskip("transformers")
    full = exporting.from_hf_config(TINY_LLAMA, batch=2, sequence=16, label="tiny")
    written = hf_blocks.build_decoder(TINY_LLAMA, name="tiny").SerializeToString()
    assert export_parity.kernels(written, 2, 16) == export_parity.kernels(full, 2, 16)
    export_parity.assert_priced_alike(full, written, 2, 16)


def test_registry_lists_the_written_families() -> None:
    assert set(hf_blocks.MODEL_TYPES) <= set(exporting.WRITTEN_MODEL_TYPES)
    assert not set(exporting.WRITTEN_MODEL_TYPES) & set(exporting.UNSUPPORTED_MODEL_TYPES)
    assert json.loads((CONFIGS / "mixtral_8x7b.json").read_text())["model_type"] in (
        hf_blocks.MOE_TYPES)


# Published sizes (HF model cards): t5-base 222,903,552; flan-t5-base 247,577,856 (gated-GELU
# feed-forward of 2048, untied head).
@pytest.mark.parametrize(("overrides", "published"), [
    ({}, 222_903_552),
    ({"feed_forward_proj": "gated-gelu", "d_ff": 2048, "tie_word_embeddings": False},
     247_577_856)])
def test_t5_encoder_decoder_counts_as_published(overrides: dict[str, object],
                                                published: int) -> None:
    config = {**zoo.load_hf_config(CONFIGS / "t5_base.json"), **overrides}
    assert hf_seq2seq.parameter_count(hf_seq2seq.seq2seq_shape(config)) == published
    g = graph.load_model(hf_seq2seq.build_t5(config, name="t5").SerializeToString(), batch=2,
                         dim_bindings={"sequence": 32})
    assert g.parameter_count == published and g.unknown_op_types == ()
    assert g.layers[-1].outputs[0].shape == (2, 32, 32128)
    # 12 encoder self-attentions, 12 decoder self- and 12 cross-attentions: 36 softmaxes
    assert Counter(ly.family for ly in g.layers)[OpFamily.SOFTMAX] == 36
    cross = next(ly for ly in g.layers if ly.name == "decoder.block.0.layer.1.EncDecAttention.k")
    assert cross.inputs[0].name == "encoder.final_layer_norm"  # keys from the encoder
