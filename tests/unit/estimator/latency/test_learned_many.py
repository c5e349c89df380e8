"""Pricing several devices at once is pricing each alone, with fewer model calls."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplan_estimator import devices, graph
from gpuplan_estimator.latency import learned, selection
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step
from gpuplan_testing import operator_harness as h


@pytest.fixture(scope="module")
def shipped() -> learned.LearnedPredictor:
    bounded, source = selection.select_predictor(None)
    predictor = getattr(bounded, "inner", bounded)  # under the sibling bound (latency.monotone)
    if not isinstance(predictor, learned.LearnedPredictor):
        pytest.fail(f"the shipped bundle did not load: {source}")
    return predictor


def test_predict_many_equals_predict_on_every_catalog_device(
        shipped: learned.LearnedPredictor, monkeypatch: pytest.MonkeyPatch) -> None:
    g = graph.load_model(h.RESNET50.read_bytes(), batch=8)
    items = [i for i in build_step(g, TrainingSettings(batch_size=8)).items if i.kernel != "none"]
    specs = [*devices.load_catalog().devices, devices.resolve_device("cpu")]
    calls: list[int] = []
    original = learned.LayerLatencyModel.predict_quantiles

    def counted(self: learned.LayerLatencyModel, x: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(len(x))
        return original(self, x)

    monkeypatch.setattr(learned.LayerLatencyModel, "predict_quantiles", counted)
    together = shipped.predict_many(items, specs)
    batched_calls = len(calls)
    calls.clear()
    alone = [shipped.predict(items, spec) for spec in specs]
    assert batched_calls < len(calls)  # one call per model, not per model and device
    for spec, many, one in zip(specs, together, alone, strict=True):
        assert many.predictor == one.predictor, spec.key
        for field in ("median_ms", "p10_ms", "p90_ms"):
            np.testing.assert_array_equal(getattr(many, field), getattr(one, field),
                                          err_msg=f"{spec.key} {field}")
