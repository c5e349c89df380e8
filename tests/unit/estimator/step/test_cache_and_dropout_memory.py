"""A causal LM's key/value cache in the memory walk: with `use_cache` (transformers' default)
a forward copies each layer's keys and values into the cache; inference holds them to the end,
training with fused attention until the layer's backward (an H200 measured 2 x layers x batch
x sequence x hidden x bytes over the walk without them, for GPT-2 and OPT, in both); BERT has
none. And training's dropout masks, one byte an element of each dropped hidden state."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_estimator import graph
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.graph import exporting
from gpuplan_estimator.step import memory, training_ops
from gpuplan_estimator.step.decomposition import TrainingSettings

BATCH, SEQ, HIDDEN, LAYERS = 8, 64, 64, 3
GPT2 = {"model_type": "gpt2", "n_embd": HIDDEN, "n_head": 4, "n_layer": LAYERS,
        "vocab_size": 100, "n_positions": 64}
OPT = {"model_type": "opt", "hidden_size": HIDDEN, "num_attention_heads": 4,
       "num_hidden_layers": LAYERS, "vocab_size": 100, "ffn_dim": 256,
       "max_position_embeddings": 64}
LLAMA = {"model_type": "llama", "hidden_size": HIDDEN, "num_attention_heads": 4,
         "num_key_value_heads": 2, "num_hidden_layers": LAYERS, "intermediate_size": 128,
         "vocab_size": 100}
BERT = {"model_type": "bert", "hidden_size": HIDDEN, "num_attention_heads": 4,
        "num_hidden_layers": LAYERS, "intermediate_size": 256, "vocab_size": 100,
        "max_position_embeddings": 64, "type_vocab_size": 2}


def _graph(config: dict[str, Any]) -> ModelGraph:
    data = exporting.hf_config_graph(config, batch=BATCH, sequence=SEQ, label="t")
    return graph.load_model(data, batch=BATCH, dim_bindings={"sequence": SEQ})


def _peak(g: ModelGraph, mode: str, precision: str = "fp32", attention: str = "fused") -> int:
    s = TrainingSettings(batch_size=BATCH, mode=mode, precision=precision, attention=attention)
    return memory.training_memory(g, s).allocated_peak_bytes


@pytest.mark.parametrize(("config", "precision", "key_bytes", "value_bytes"), [
    (GPT2, "fp32", 4, 4), (GPT2, "bf16", 2, 2), (OPT, "fp32", 4, 4), (OPT, "bf16", 2, 2),
    # Autocast runs RoPE in fp32 (bf16 keys times the fp32 residual stream's cos): fp32 keys.
    (LLAMA, "fp32", 4, 4), (LLAMA, "bf16", 4, 2)])
def test_an_inference_forward_holds_every_layers_keys_and_values(
        config: dict[str, Any], precision: str, key_bytes: int, value_bytes: int) -> None:
    cached, uncached = _graph(config), _graph(config | {"use_cache": False})
    assert len(cached.cache_tensors) == 2 * LAYERS and uncached.cache_tensors == ()
    made = {t.name for la in cached.layers for t in la.outputs}
    assert set(cached.cache_tensors) <= made  # named tensors survive fusion
    kv_width = HIDDEN * config.get("num_key_value_heads", 4) // 4  # grouped-query: fewer
    cache_bytes = LAYERS * BATCH * SEQ * kv_width * (key_bytes + value_bytes)
    for mode, attention in (("inference", "fused"), ("inference", "eager"),
                            ("train", "fused")):
        extra = (_peak(cached, mode, precision, attention)
                 - _peak(uncached, mode, precision, attention))
        # The peaks with and without it need not fall on the same layer in a model this small.
        assert cache_bytes * 0.9 <= extra <= cache_bytes, (mode, attention)
    # Eager attention's matmuls already keep contiguous copies of the strided keys and values.
    assert _peak(cached, "train", precision, "eager") == _peak(uncached, "train", precision,
                                                                "eager")


def test_an_encoder_has_no_cache() -> None:
    assert _graph(BERT).cache_tensors == ()


def test_an_encoder_decoder_caches_its_decoders_self_and_cross_attention() -> None:
    t5 = {"model_type": "t5", "d_model": HIDDEN, "num_heads": 4, "num_layers": LAYERS,
          "num_decoder_layers": 2, "d_kv": 16, "d_ff": 128, "vocab_size": 100}
    cached, uncached = _graph(t5), _graph(t5 | {"use_cache": False})
    assert len(cached.cache_tensors) == 2 * 2 * 2 and uncached.cache_tensors == ()
    assert all(name.startswith("decoder.") for name in cached.cache_tensors)
    assert _peak(cached, "inference") > _peak(uncached, "inference")
    assert _peak(cached, "train") > _peak(uncached, "train")


@pytest.mark.parametrize(("config", "key", "sites"), [
    (GPT2, "resid_pdrop", 2 * LAYERS), (OPT, "dropout", 2 * LAYERS),
    (BERT, "hidden_dropout_prob", 2 * LAYERS + 1)])
def test_training_keeps_a_one_byte_mask_per_dropped_hidden_state(
        config: dict[str, Any], key: str, sites: int) -> None:
    """What a GPT-2, OPT or BERT step kept beyond the walk on the H200 (96 MiB for GPT-2
    medium at batch 4, two residual dropouts a layer), in fp32 and bf16 alike."""
    dropped, plain = _graph(config), _graph(config | {key: 0.0, "embd_pdrop": 0.0})
    assert len(dropped.dropout_tensors) >= sites and plain.dropout_tensors == ()
    mask = BATCH * SEQ * HIDDEN  # one byte an element
    for precision in ("fp32", "bf16"):
        extra = _peak(dropped, "train", precision) - _peak(plain, "train", precision)
        # The peak may fall in backward once the last layer freed its two masks.
        assert (sites - 2) * mask <= extra <= len(dropped.dropout_tensors) * mask
        assert _peak(dropped, "inference", precision) == _peak(plain, "inference", precision)


def test_an_exports_cache_outputs_are_returned_not_scored_by_the_loss() -> None:
    # A decoder exported with use_cache returns `present.*` beside its logits: the training
    # loss reads the logits alone, so no log-probabilities or gradients of the cache.
    from gpuplan_estimator.core.layers import OpFamily
    from gpuplan_estimator.step import memory_walk
    from gpuplan_testing.layer_builders import layer, t

    def walk(cache_name: str) -> memory_walk.PeakParts:
        g = ModelGraph("dec", (
            layer("proj", "MatMul", [t("x", 512, 64), t("w", 64, 256)], [t("h", 512, 256)],
                  params=["w"]),
            layer("head", "MatMul", [t("h", 512, 256), t("wo", 256, 10)],
                  [t("logits", 512, 10)], params=["wo"]),
            # An export's present.* is a view of the keys or values the layer saves anyway.
            layer("cache", "Reshape", [t("h", 512, 256), t("shape", 3, dtype="int64")],
                  [t(cache_name, 512, 4, 64)]),
        ), (), {}, 17, ())
        assert all(la.family is not OpFamily.OTHER for la in g.layers)
        settings = memory_walk.WalkSettings(training=True, half_bytes=0, optimizer="sgd",
                                            optimizer_state_words=0, batch_scale=1.0,
                                            allocation_round_bytes=1)
        return memory_walk.peak(g, settings)

    assert training_ops.is_cache_output("present.0.key")
    assert not training_ops.is_cache_output("logits")
    scored, returned = walk("hidden_out"), walk("present.0.key")
    # Scored as logits, it would add fp32 log-probabilities (512 x 256 x 4 bytes) and their
    # gradients; returned, it is a view of what backward keeps anyway.
    assert scored.total_bytes - returned.total_bytes >= 512 * 256 * 4
