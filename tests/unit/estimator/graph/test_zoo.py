"""zoo: structure-only transformers parse, and their parameters match formula and papers."""

from __future__ import annotations

import os
from collections import Counter

import pytest

from gpuplan_estimator import graph
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.graph import zoo
from gpuplan_testing.paths import SHARED_DATA

CONFIGS = SHARED_DATA / "model-labels" / "model_configs"
pytestmark = pytest.mark.skipif(not CONFIGS.is_dir() and os.environ.get("CI") != "true",
                                reason="shared model configs absent (../shared/data)")


def config(name: str) -> dict[str, object]:
    return zoo.load_hf_config(CONFIGS / f"{name}.json")


def parse(name: str, batch: int = 1, seq: int = 128) -> object:
    data = zoo.build_transformer(config(name), name=name).SerializeToString()
    return graph.load_model(data, batch=batch, dim_bindings={"sequence": seq})


# Published sizes: GPT-2 medium 355 M / large 774 M (Radford et al. 2019, HF model cards);
# BERT-base 110 M (Devlin et al. 2018); OPT-1.3B (Zhang et al. 2022). Our BERT graph is
# BertLMHeadModel: no pooler, plus the MLM head (dense+LN+decoder bias) → 109.51 M.
@pytest.mark.parametrize(("name", "exact", "published"), [
    ("gpt2_med", 354_823_168, 355e6),
    ("gpt2_large", 774_030_080, 774e6),
    ("bert", 109_514_298, 110e6),
    ("opt_13", 1_315_758_080, 1.3e9),
])
def test_parameter_count_matches_formula_and_publication(
        name: str, exact: int, published: float) -> None:
    g = parse(name, seq=16)
    assert g.parameter_count == zoo.transformer_parameter_count(config(name)) == exact
    assert abs(exact - published) / published < 0.015
    assert g.unknown_op_types == ()


@pytest.mark.parametrize("name", ["bert_large", "gpt2_xl", "gpt3_xl", "gpt3_27", "opt"])
def test_every_config_parses_with_formula_count(name: str) -> None:
    g = parse(name, seq=16)
    assert g.parameter_count == zoo.transformer_parameter_count(config(name))
    assert g.layers[-1].outputs[0].shape[:2] == (1, 16)


def test_gpt2_structure_op_for_op() -> None:
    cfg = config("gpt2_med")
    g = parse("gpt2_med", batch=2, seq=64)
    layers = 24
    families = Counter(ly.family for ly in g.layers)
    # per layer: c_attn, 2 bmm, c_proj, c_fc, c_proj; plus the tied LM head
    assert families[OpFamily.MATMUL] == 6 * layers + 1
    assert families[OpFamily.SOFTMAX] == layers
    assert families[OpFamily.NORMALIZATION] == 2 * layers + 1
    assert families[OpFamily.EMBEDDING] == 2
    assert Counter(u.pattern for u in g.units) == {"gelu": layers, "attention": layers}
    h, heads = int(cfg["n_embd"]), int(cfg["n_head"])
    scores = next(ly for ly in g.layers if ly.name.endswith("h.0.attn.scores"))
    assert scores.outputs[0].shape == (2, heads, 64, 64)
    assert scores.flops == 2 * 2 * heads * 64 * 64 * (h // heads)
    head = next(ly for ly in g.layers if ly.name == "lm_head")
    assert head.parameter_count == 0 and head.parameter_inputs == ("transformer.wte.weight",)


@pytest.mark.parametrize(("activation", "kernels"), [
    ("gelu_pytorch_tanh", {"Gelu": 1}), ("gelu", {"Gelu": 1}),
    ("gelu_new", {"Pow": 1, "Tanh": 1, "Mul": 4, "Add": 2})])
def test_the_mlp_activation_has_the_kernels_pytorch_runs(
        activation: str, kernels: dict[str, int]) -> None:
    """gelu_pytorch_tanh is F.gelu(approximate="tanh"), one kernel (as hf_blocks builds it for
    Gemma); gelu_new is NewGELUActivation's Python expression, eight eager kernels."""
    cfg = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2, "n_positions": 32,
           "vocab_size": 100, "activation_function": activation, "layer_norm_epsilon": 1e-5}
    data = zoo.build_transformer(cfg, name=activation).SerializeToString()
    g = graph.load_model(data, batch=1, dim_bindings={"sequence": 32})
    act = Counter(ly.op_type for ly in g.layers if ".mlp.act" in ly.name)
    assert act == Counter({op: n * 2 for op, n in kernels.items()})  # per layer, 2 layers


def test_gpt2_large_parses_with_its_cache() -> None:
    """Its load time is a benchmark (`make bench`, gpt2-large), not asserted here: a loaded
    CI machine took 1.1 s where the dev box takes 0.5."""
    data = zoo.build_transformer(config("gpt2_large"), name="gpt2_large").SerializeToString()
    g = graph.load_model(data, batch=1, dim_bindings={"sequence": 1024})
    assert len(g.layers) > 1500
    assert len(g.cache_tensors) == 2 * 36  # keys and values of its 36 layers (use_cache)


def test_unsupported_model_type_and_missing_key() -> None:
    with pytest.raises(errors.InvalidRequestError, match="switch_transformers"):
        zoo.build_transformer(config("switchxl4"), name="switch")
    cfg = dict(config("gpt2_med"))
    del cfg["n_head"]
    with pytest.raises(errors.InvalidRequestError, match=r"config\.n_head"):
        zoo.build_transformer(cfg, name="broken")
