"""docs/estimate-json.md's example cannot drift from what `json_documents.estimate_json`
produces: every key it shows exists in a real document of the same run (new fields in the code
are fine)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import paths
from gpuplan_estimator.graph import examples
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings

DOC = paths.REPO_ROOT / "docs" / "estimate-json.md"


def _documented_example() -> dict[str, Any]:
    found = re.search(r"```json\n(.*?)\n```", DOC.read_text(encoding="utf-8"), re.S)
    assert found is not None, "docs/estimate-json.md has no ```json example"
    example: dict[str, Any] = json.loads(found.group(1))
    return example


def _missing_keys(documented: Any, real: Any, where: str = "") -> list[str]:
    """Key paths of `documented` that `real` lacks (lists: their first elements)."""
    if isinstance(documented, dict):
        if not isinstance(real, dict):
            return [where or "(top)"]
        out = []
        for key, value in documented.items():
            if key not in real:
                out.append(f"{where}.{key}")
            elif key != "predictor":  # shares are keyed by predictor label, which is data
                out += _missing_keys(value, real[key], f"{where}.{key}")
        return out
    if isinstance(documented, list) and documented and isinstance(documented[0], dict):
        return _missing_keys(documented[0], real[0] if real else None, f"{where}[0]")
    return []


def _real_document() -> dict[str, Any]:
    """The document of the documented run: the shipped ResNet-50 at batch 8 on a T4, every
    layer included (the example shows `layers` as a placeholder)."""
    graph = examples.resnet50(8)
    predictor, source = selection.select_predictor(None)
    settings = TrainingSettings(batch_size=8, optimizer="adamw")
    results = estimates.estimate(graph, [devices.load_catalog().resolve("t4")], settings,
                                 predictor=predictor)
    return json_documents.estimate_json(graph, results, settings, predictor_source=source,
                             include_layers=True)


def test_every_documented_key_is_in_the_real_document() -> None:
    documented, real = _documented_example(), _real_document()
    assert _missing_keys(documented, real) == []
    assert _missing_keys(documented["devices"][0]["top_layers"][0], real["devices"][0]["layers"][0]
                         ) == []


def test_documented_predictor_source_matches_the_shares_it_shows() -> None:
    """A roofline source cannot come with LightGBM shares (the example's old mistake)."""
    documented, real = _documented_example(), _real_document()
    kind = documented["predictor_source"].split(":")[0]
    assert kind == real["predictor_source"].split(":")[0]
    shares = documented["devices"][0]["predictor"]
    assert any(label.startswith("lightgbm:") for label in shares) == (kind == "bundle")
    assert sum(shares.values()) == pytest.approx(1.0, abs=0.01)
