"""Fused attention in the graphs exporters really write (issue #30 part 3).

The corpus (`tests/fixtures/attention_corpus`, made by `hack/attention_corpus.py`): tiny
Hugging Face BERT, GPT-2 and OPT exported by each torch version we could install, with the
dynamo exporter (optimized and not) and the TorchScript exporter, with and without an attention
mask, in transformers' "sdpa" and "eager" attention. For every graph, `graph.fusion` finds one
attention core per layer, and a fused training estimate is faster and smaller than the eager
one. A live export with the installed torch checks the exporter of today as well.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from gpuplan_estimator import RooflinePredictor, TrainingSettings, estimate, graph, load_catalog
from gpuplan_estimator.core import options
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.step import attention

CORPUS = Path(__file__).parents[3] / "fixtures" / "attention_corpus"
MAX_FIXTURE_BYTES = 300_000
MODELS = ("bert", "gpt2", "opt")
EXPORTERS = ("dynamo", "dynamo-noopt", "torchscript")


def _manifests() -> dict[str, list[dict[str, Any]]]:
    return {path.parent.name: json.loads(path.read_text())["entries"]
            for path in sorted(CORPUS.glob("torch-*/manifest.json"))}


MANIFESTS = _manifests()
EXPORTED = [pytest.param(entry, id=entry["file"].removesuffix(".onnx"))
            for entries in MANIFESTS.values() for entry in entries if entry["file"]]


def test_the_corpus_covers_each_model_exporter_mask_and_attention_per_version() -> None:
    assert len(MANIFESTS) >= 2, "two torch versions at least"
    for version, entries in MANIFESTS.items():
        cases = {(e["model"], e["attn_implementation"], e["exporter"], e["mask"])
                 for e in entries}
        assert cases == {(m, a, x, k) for m in MODELS for a in ("sdpa", "eager")
                         for x in EXPORTERS for k in (True, False)}, version
        for entry in entries:
            # A missing graph is an exporter's recorded refusal, never a silent gap.
            assert (entry["file"] is None) == ("error" in entry), entry
            assert {"torch", "transformers", "onnx", "command", "date"} <= set(entry)
            assert f"torch-{entry['torch'].split('+')[0]}" == version
        exported = [e for e in entries if e["file"]]
        for exporter in EXPORTERS:  # every exporter contributes graphs in every version
            assert any(e["exporter"] == exporter for e in exported), (version, exporter)


def _estimates(g: ModelGraph, batch: int) -> dict[str, Any]:
    device = load_catalog().resolve("h100-sxm-80gb")
    return {a: estimate(g, [device], TrainingSettings(batch_size=batch, mode="train",
                                                      attention=a),
                        predictor=RooflinePredictor())[0]
            for a in options.ATTENTIONS}


@pytest.mark.parametrize("entry", EXPORTED)
def test_every_attention_layer_is_one_fused_core_and_fused_is_cheaper(
        entry: dict[str, Any]) -> None:
    path = CORPUS / entry["file"]
    data = path.read_bytes()
    assert len(data) < MAX_FIXTURE_BYTES
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    g = graph.load_model(data)
    report = attention.attention_report(g, options.FUSED_ATTENTION)
    assert (report.cores, report.fused_cores, report.unfused_scores, report.warning) == (
        entry["attention_layers"], entry["attention_layers"], 0, None)
    priced = _estimates(g, entry["batch"])
    eager, fused = priced[options.EAGER_ATTENTION], priced[options.FUSED_ATTENTION]
    assert fused.step_time_ms < eager.step_time_ms
    assert fused.memory.activations_bytes < eager.memory.activations_bytes
    assert fused.memory.total_bytes < eager.memory.total_bytes


@pytest.mark.slow
def test_a_live_dynamo_export_of_the_installed_torch_has_its_cores() -> None:
    """GPT-2 (2 layers, SDPA, padding mask) exported now, as `torch.onnx.export(dynamo=True)`
    writes it by default: the NaN-guarded core of each layer is found. One tiny model: the
    exporter's own start-up is most of its seconds (about 10 s on a loaded 2-core machine)."""
    import torch
    import transformers

    config = transformers.GPT2Config(vocab_size=64, n_embd=32, n_head=2, n_layer=2,
                                     n_positions=32)
    config.use_cache = False
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).eval()
    ids = torch.zeros((1, 32), dtype=torch.long)
    mask = torch.ones_like(ids)
    from gpuplan_estimator.graph import exporting

    with exporting.quiet_exporter():
        program = torch.onnx.export(model, (ids,), kwargs={"attention_mask": mask},
                                    dynamo=True)
    g = graph.load_model(program.model_proto.SerializeToString())
    report = attention.attention_report(g, options.FUSED_ATTENTION)
    assert (report.cores, report.warning) == (2, None)
    guards = {layer.name for layer in g.layers if layer.op_type == "IsNaN"}
    members = {name for unit in g.units if unit.pattern == attention.ATTENTION_PATTERN
               for name in unit.layer_names}
    assert guards and guards <= members, "the NaN guard of every SDPA is in its core"
