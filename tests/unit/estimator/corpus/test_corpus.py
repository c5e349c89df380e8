"""A slice of the real-model corpus (`campaigns.corpus`; `make corpus` runs all of it at
full size): models people train, exported the ways they export them, estimate in train and
inference mode with no uncovered ops and matmul/conv FLOPs within 2 % of PyTorch's own count.

Graphs are exported at test time into a session directory, never committed.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from campaigns import corpus
from gpuplan_estimator import graph

SLICE = [
    ("resnet50", "dynamo"), ("mobilenet_v3_large", "torchscript"),
    ("vit_b_16", "dynamo-opt"), ("gpt2", "dynamo"), ("gpt2", "ort-fused"),
    ("gpt-neo", "dynamo"), ("opt", "dynamo"), ("llama", "dynamo-opt"), ("mistral", "dynamo"),
    ("bert", "ort-fused"), ("t5", "torchscript"), ("whisper-encoder", "dynamo"),
]


@pytest.fixture(scope="session")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


@pytest.mark.parametrize(("name", "exporter"), SLICE)
def test_real_exports_estimate_with_flops_within_two_percent(name: str, exporter: str,
                                                             workdir: Path) -> None:
    case = corpus.CASES_BY_NAME[name]
    reference, _ = corpus.reference_flops(case, "small")
    row = corpus.measure(case, exporter, "small", workdir, reference)
    assert row.error is None
    assert row.uncovered == ()
    assert row.flops_ratio == pytest.approx(1.0, abs=0.02)


def test_a_static_dynamo_export_is_rebatched(workdir: Path) -> None:
    """GPT-2 exported at input_ids[2, 16] estimates at batch 8 (its Range and Reshape
    constants carry the batch), and a static input's leading dim is the batch."""
    path = workdir / "gpt2-rebatch.onnx"
    corpus.export(corpus.CASES_BY_NAME["gpt2"], "dynamo", "small", path)
    assert graph.model_batch(graph.load_model(path), None) == corpus.TEXT_BATCH
    g = graph.load_at_batch(path, 8, {})
    assert graph.graph_batch(g) == 8
