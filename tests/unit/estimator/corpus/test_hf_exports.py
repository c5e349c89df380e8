"""Real exports: tiny Hugging Face models exported by torch.onnx's dynamo exporter (optimize off,
as users do), estimated in train and inference mode, FLOPs checked against the analytic count.

The full-size corpus (torchvision, Llama, Mistral, Whisper, ...) is issue #15's open work; this
is its first slice. Graphs are exported at test time into a session cache, never committed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, graph, load_catalog
from gpuplan_estimator.core.layers import ModelGraph, OpFamily

BATCH, SEQUENCE = 2, 16
HIDDEN, LAYERS, VOCAB = 64, 2, 128


def _gpt2() -> Any:
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=HIDDEN, n_head=4, n_layer=LAYERS, vocab_size=VOCAB, n_positions=64,
        use_cache=False))


def _opt() -> Any:
    return transformers.OPTForCausalLM(transformers.OPTConfig(
        hidden_size=HIDDEN, num_attention_heads=4, num_hidden_layers=LAYERS, ffn_dim=4 * HIDDEN,
        vocab_size=VOCAB, max_position_embeddings=64, word_embed_proj_dim=HIDDEN,
        use_cache=False))


MODELS: dict[str, Callable[[], Any]] = {"gpt2": _gpt2, "opt": _opt}


@pytest.fixture(scope="session")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each model exported once per session with a static input_ids[BATCH, SEQUENCE]."""
    out = tmp_path_factory.mktemp("hf-exports")
    paths = {}
    for name, build in MODELS.items():
        torch.manual_seed(0)
        model = build().eval()
        ids = torch.zeros((BATCH, SEQUENCE), dtype=torch.long)
        program = torch.onnx.export(model, (ids,), dynamo=True, optimize=False)
        paths[name] = out / f"{name}.onnx"
        program.save(str(paths[name]))
    return paths


def analytic_forward_flops() -> int:
    """2 FLOPs per weight per token (QKV, projection, 2 MLP GEMMs, the LM head) plus the two
    attention GEMMs (scores and weighted values: 2·2·sequence·hidden per token and layer)."""
    tokens = BATCH * SEQUENCE
    per_token = LAYERS * (2 * 12 * HIDDEN**2 + 4 * SEQUENCE * HIDDEN) + 2 * VOCAB * HIDDEN
    return tokens * per_token


def matmul_flops(g: ModelGraph) -> int:
    return sum(layer.flops for layer in g.layers if layer.family is OpFamily.MATMUL)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_dynamo_export_estimates_in_train_and_inference(name: str,
                                                        exports: dict[str, Path]) -> None:
    g = graph.load_model(exports[name])
    assert graph.model_batch(g, None) == BATCH  # static input: its leading dim is the batch
    t4 = load_catalog().resolve("t4")
    for mode in ("train", "inference"):
        (result,) = estimate(g, [t4], TrainingSettings(batch_size=BATCH, mode=mode),
                             predictor=RooflinePredictor())
        assert result.step_time_ms > 0 and result.fits
    assert matmul_flops(g) == pytest.approx(analytic_forward_flops(), rel=0.02)
