"""hf_whisper: Whisper written layer by layer from a Hugging Face config, priced like the full
torch export, with parameter counts equal to transformers' and near the paper's (#34)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from gpuplan_estimator import graph
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import ModelGraph, OpFamily
from gpuplan_estimator.graph import exporting, hf_whisper, zoo
from gpuplan_testing import export_parity

CONFIGS = Path(zoo.__file__).parent.parent / "data" / "model_configs"
TINY_WHISPER = {"architectures": ["WhisperForConditionalGeneration"], "model_type": "whisper",
                "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
                "encoder_attention_heads": 4, "decoder_attention_heads": 4,
                "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "vocab_size": 128,
                "num_mel_bins": 8, "max_source_positions": 30, "max_target_positions": 64,
                "pad_token_id": 1, "bos_token_id": 1, "eos_token_id": 2,
                "decoder_start_token_id": 3}


def shipped(name: str) -> dict[str, object]:
    return zoo.load_hf_config(CONFIGS / f"whisper_{name}.json")


def load(config: dict[str, object], batch: int = 2, sequence: int = 16) -> ModelGraph:
    data = hf_whisper.build_whisper(config, name="w").SerializeToString()
    return graph.load_model(data, batch=batch, dim_bindings={"sequence": sequence})


# Paper: Radford et al. 2022, "Robust Speech Recognition via Large-Scale Weak Supervision"
# (arXiv:2212.04356), Table 1. Exact: transformers 5.24's WhisperForConditionalGeneration on
# the meta device, sum of parameter numels (2026-11-28; test_transformers_counts_the_same_
# parameters recomputes them). The paper's tiny and base figures are 3.2 % and 1.9 % above
# every count of the released weights (HF's, and OpenAI's, which holds the encoder positions
# as a buffer and counts less); from small up they agree within 1 %.
@pytest.mark.parametrize(("name", "paper", "exact", "tolerance"), [
    ("tiny", 39e6, 37_760_640, 0.035), ("base", 74e6, 72_593_920, 0.02),
    ("small", 244e6, 241_734_912, 0.01), ("medium", 769e6, 763_857_920, 0.01),
    ("large", 1550e6, 1_543_304_960, 0.01)])
def test_counts_are_transformers_own_and_near_the_paper(name: str, paper: float, exact: int,
                                                        tolerance: float) -> None:
    assert hf_whisper.parameter_count(hf_whisper.whisper_shape(shipped(name))) == exact
    assert abs(exact - paper) / paper < tolerance


def test_the_graph_is_whisper_base_at_the_config_audio_length() -> None:
    """Two convs over 3000 mel frames to 1500 positions; 6 encoder self-attentions, 6
    decoder self- and 6 cross-attentions; cross-attention keys from the encoder's output;
    logits over the vocabulary for each decoder token."""
    g = load(shipped("base"), batch=2, sequence=32)
    assert g.parameter_count == 72_593_920 and g.unknown_op_types == ()
    convs = [ly for ly in g.layers if ly.op_type == "Conv"]
    assert [c.inputs[0].shape for c in convs] == [(2, 80, 3000), (2, 512, 3000)]
    assert convs[-1].outputs[0].shape == (2, 512, 1500)
    assert Counter(ly.family for ly in g.layers)[OpFamily.SOFTMAX] == 18
    cross = next(ly for ly in g.layers if ly.name == "model.decoder.layers.0.encoder_attn.k_proj")
    assert cross.inputs[0].name == "model.encoder.layer_norm"
    assert cross.inputs[0].shape == (2, 1500, 512)
    assert g.layers[-1].outputs[0].shape == (2, 32, 51865)


def test_the_sequence_is_the_decoder_length_only() -> None:
    """The audio is fixed by the config: a longer decoder sequence leaves every encoder
    kernel, and the cross-attention's keys and values over the audio, as they were, and
    doubles the decoder's token-wise work."""
    def flops(g: ModelGraph, prefix: str) -> int:
        return sum(ly.flops for ly in g.layers if ly.name.startswith(prefix))

    short, long = load(TINY_WHISPER, sequence=16), load(TINY_WHISPER, sequence=32)
    assert flops(short, "model.encoder.") == flops(long, "model.encoder.") > 0
    cross_kv = "model.decoder.layers.0.encoder_attn.k_proj"
    assert flops(short, cross_kv) == flops(long, cross_kv) > 0
    ffn = "model.decoder.layers.0.fc1"
    assert flops(long, ffn) == 2 * flops(short, ffn) > 0


def test_transformers_counts_the_same_parameters() -> None:
    """Every shipped size, large-v3 (128 mel bins, 51866 tokens) and an untied head, against
    WhisperForConditionalGeneration built on the meta device: equal to the parameter."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")

    def counted(config: dict[str, object]) -> int:
        with torch.device("meta"):
            model = transformers.WhisperForConditionalGeneration(
                transformers.WhisperConfig(**config))
        return sum(p.numel() for p in model.parameters())

    untied = {**TINY_WHISPER, "tie_word_embeddings": False}
    configs = [shipped(n) for n in ("tiny", "base", "small", "medium", "large")]
    configs += [{**shipped("large"), "num_mel_bins": 128, "vocab_size": 51866}, untied]
    for config in configs:
        assert hf_whisper.parameter_count(hf_whisper.whisper_shape(config)) == counted(config)
    assert load(untied).parameter_count == counted(untied) == counted(TINY_WHISPER) + 128 * 64


@pytest.fixture(scope="module")
def full_export() -> bytes:
    """TINY_WHISPER built by transformers on the meta device and exported (once: ~10 s)."""
    pytest.importorskip("transformers")
    return exporting.from_hf_config(TINY_WHISPER, batch=2, sequence=16, label="tiny")


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_the_shortcut_prices_like_the_full_export(full_export: bytes, mode: str) -> None:
    """The graph written from the config against transformers' WhisperForConditionalGeneration
    built on the meta device and exported by torch.onnx (dynamo): the same kernels, layer for
    layer, hence the same GPU time and weight, gradient and optimizer memory (as for Llama in
    test_hf_blocks.py, whose docstring says what differs by the export's bookkeeping).

    Inference's live-tensor peak falls in the decoder, where the export still holds ~240
    folded shape constants of one 512-byte allocation block each (~120 KiB, a fixed amount:
    2e-4 of this tiny model's total, nothing at real sizes); training's peak is the optimizer
    step, where they are gone."""
    written = hf_whisper.build_whisper(TINY_WHISPER, name="tiny").SerializeToString()
    assert export_parity.kernels(written, 2, 16) == export_parity.kernels(full_export, 2, 16)
    export_parity.assert_priced_alike(full_export, written, 2, 16, mode,
                                      total_rel=1e-4 if mode == "train" else 5e-4)


def test_the_decoder_length_is_asked_for_and_capped() -> None:
    config = shipped("large")
    with pytest.raises(errors.InvalidRequestError, match=r"--dim sequence=N, at most 448"):
        exporting.check_hf_request(config, batch=8, sequence=None, label="w")
    with pytest.raises(errors.InvalidRequestError, match="max_target_positions") as exc:
        exporting.check_hf_request(config, batch=8, sequence=449, label="w")
    assert exc.value.field == "dim_bindings.sequence"
    with pytest.raises(errors.InvalidRequestError, match="attention scores") as exc:
        exporting.check_hf_request(config, batch=10**7, sequence=448, label="w")
    assert exc.value.field == "batch"
    exporting.check_hf_request(config, batch=8, sequence=448, label="w")


@pytest.mark.parametrize(("overrides", "key"), [
    ({"encoder_attention_heads": 5}, "config.encoder_attention_heads"),
    ({"d_model": None}, "config.d_model"),
    ({"max_target_positions": 0}, "config.max_target_positions"),
    ({"activation_function": "swish_v9"}, "config.activation_function")])
def test_bad_configs_name_the_key(overrides: dict[str, object], key: str) -> None:
    with pytest.raises(errors.InvalidRequestError) as exc:
        hf_whisper.build_whisper({**TINY_WHISPER, **overrides}, name="bad")
    assert exc.value.field == key
