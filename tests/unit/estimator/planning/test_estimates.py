"""The estimate facade: phases, per-layer sums, dedupe, epochs, predictor shares, JSON."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph, OpFamily
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.cost.predictors import LatencyPrediction
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step
from gpuplan_testing.layer_builders import layer, t


def blocks(n: int, batch: int = 32, width: int = 512, custom: bool = False) -> ModelGraph:
    """`n` identical Linear+Relu blocks: identical work items that must be priced once."""
    layers = []
    x = "x"
    for i in range(n):
        layers.append(layer(f"fc{i}", "Gemm", [t(x, batch, width), t(f"w{i}", width, width),
                                               t(f"b{i}", width)],
                            [t(f"h{i}", batch, width)], params=[f"w{i}", f"b{i}"]))
        layers.append(layer(f"relu{i}", "Relu", [t(f"h{i}", batch, width)],
                            [t(f"a{i}", batch, width)]))
        x = f"a{i}"
    if custom:
        layers.append(layer("odd", "MyCustomOp", [t(x, batch, width)], [t("y", batch, width)]))
    unknown = tuple(sorted({x.op_type for x in layers if x.family is OpFamily.OTHER}))
    return ModelGraph("blocks", tuple(layers), (), {"batch": batch}, 17, unknown)


class Recording:
    """The real roofline, recording what it is asked; optionally relabelling gemm items."""

    def __init__(self, learned_gemm: bool = False) -> None:
        self.inner = roofline.RooflinePredictor()
        self.name = "lightgbm" if learned_gemm else "roofline"
        self.learned_gemm = learned_gemm
        self.calls: list[tuple[int, str]] = []

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        self.calls.append((len(items), device.key))
        p = self.inner.predict(items, device)
        if not self.learned_gemm:
            return p
        labels = tuple("lightgbm:gemm" if i.kernel == "gemm" else "roofline" for i in items)
        return LatencyPrediction(p.median_ms, p.median_ms * 0.8, p.median_ms * 1.3, labels)


@pytest.fixture(scope="module")
def gpus() -> list[DeviceSpec]:
    catalog = devices.load_catalog()
    return [catalog.resolve("h100-sxm-80gb"), catalog.resolve("NVIDIA Tesla T4")]


def settings(**kw: Any) -> TrainingSettings:
    return TrainingSettings(**({"batch_size": 32} | kw))


def test_phases_add_up_and_layers_sum_to_phases(gpus: list[DeviceSpec]) -> None:
    results = estimates.estimate(blocks(3), gpus, settings(), predictor=Recording())
    assert [r.device for r in results] == ["h100-sxm-80gb", "t4"]
    for r in results:
        assert r.step_time_ms == pytest.approx(r.forward_ms + r.backward_ms + r.optimizer_ms)
        assert sum(x.forward_ms for x in r.layers) == pytest.approx(r.forward_ms)
        assert sum(x.backward_ms for x in r.layers) == pytest.approx(r.backward_ms)
        # the training loss over the last block's output is a layer of the step
        assert [x.op_type for x in r.layers][-1] == "LogSoftmax"
        assert min(r.forward_ms, r.backward_ms, r.optimizer_ms) > 0
        assert r.interval_ms == pytest.approx((r.step_time_ms, r.step_time_ms))
        assert r.predictor == pytest.approx({"roofline": 1.0})
        assert r.uncovered_ops == ()
        assert r.fits
    assert results[1].step_time_ms > results[0].step_time_ms  # a T4 is slower than an H100


def test_inference_has_no_backward_or_optimizer(gpus: list[DeviceSpec]) -> None:
    (r,) = estimates.estimate(blocks(2), gpus[:1], settings(mode="inference"),
                             predictor=Recording())
    assert (r.backward_ms, r.optimizer_ms) == (0.0, 0.0)
    assert r.step_time_ms == pytest.approx(r.forward_ms) and r.forward_ms > 0


def test_identical_items_are_priced_once_with_one_call_per_device(
    gpus: list[DeviceSpec],
) -> None:
    rec = Recording()
    one = estimates.estimate(blocks(1), gpus, settings(), predictor=Recording())
    many = estimates.estimate(blocks(6), gpus, settings(), predictor=rec)
    assert [key for _, key in rec.calls] == ["h100-sxm-80gb", "t4"]
    distinct = rec.calls[0][0]
    # fc0 has no dgrad (its input is the graph input); later blocks repeat the same items.
    assert distinct < len(build_step(blocks(6), settings()).items) / 3
    # Blocks 2..6 cost the same, so forward time grows linearly in the blocks; the training
    # loss over the last block's output is there once.
    def blocks_forward_ms(r: estimates.DeviceStepEstimate) -> float:
        return sum(x.forward_ms for x in r.layers if x.op_type != "LogSoftmax")

    assert blocks_forward_ms(many[0]) == pytest.approx(6 * blocks_forward_ms(one[0]))
    assert many[0].forward_ms - blocks_forward_ms(many[0]) == pytest.approx(
        one[0].forward_ms - blocks_forward_ms(one[0]))


def test_epoch_and_total_time(gpus: list[DeviceSpec]) -> None:
    (r,) = estimates.estimate(blocks(2), gpus[:1], settings(), predictor=Recording(),
                             epochs=3, dataset_size=1000)
    assert r.steps_per_epoch == math.ceil(1000 / 32) == 32
    assert r.epoch_seconds == pytest.approx(32 * r.step_time_ms / 1000)
    assert r.total_seconds == pytest.approx(3 * r.epoch_seconds)
    (only_epoch,) = estimates.estimate(blocks(2), gpus[:1], settings(), predictor=Recording(),
                                      dataset_size=64)
    assert only_epoch.steps_per_epoch == 2 and only_epoch.total_seconds is None


@pytest.mark.parametrize(
    ("kw", "field"),
    [({"epochs": 2}, "dataset_size"), ({"epochs": 0, "dataset_size": 5}, "epochs"),
     ({"dataset_size": -1}, "dataset_size")],
)
def test_bad_sizes_name_the_field(gpus: list[DeviceSpec], kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        estimates.estimate(blocks(1), gpus, settings(), predictor=Recording(), **kw)
    assert info.value.field == field


def test_no_devices_is_an_error() -> None:
    with pytest.raises(InvalidRequestError, match="devices"):
        estimates.estimate(blocks(1), [], settings(), predictor=Recording())


def test_shares_intervals_and_uncovered_ops_of_a_learned_predictor(
    gpus: list[DeviceSpec],
) -> None:
    (r,) = estimates.estimate(blocks(2, custom=True), gpus[:1], settings(),
                             predictor=Recording(learned_gemm=True))
    assert set(r.predictor) == {"lightgbm:gemm", "roofline"}
    assert sum(r.predictor.values()) == pytest.approx(1.0)
    assert r.interval_ms == pytest.approx((0.8 * r.step_time_ms, 1.3 * r.step_time_ms))
    # Relu, the bias-gradient reduce, the loss and the optimizer passes fell back to the
    # roofline; MyCustomOp is OTHER; the Gemm itself is covered.
    assert r.uncovered_ops == ("LogSoftmax", "MyCustomOp", "ReduceSum", "Relu",
                               "optimizer:add", "optimizer:addcdiv", "optimizer:addcmul",
                               "optimizer:div", "optimizer:lerp", "optimizer:mul",
                               "optimizer:sqrt")
    by_name = {x.name: x for x in r.layers}
    assert by_name["fc1"].predictor == "lightgbm:gemm"
    assert by_name["relu1"].predictor == "roofline"
    (plain,) = estimates.estimate(blocks(2, custom=True), gpus[:1], settings(optimizer="sgd"),
                                 predictor=Recording())
    assert plain.uncovered_ops == ("MyCustomOp",)


def test_top_layers_are_the_most_expensive(gpus: list[DeviceSpec]) -> None:
    (r,) = estimates.estimate(blocks(3), gpus[:1], settings(), predictor=Recording())
    top = r.top_layers(2)
    assert len(top) == 2 and top[0].total_ms >= top[1].total_ms
    assert top[0].total_ms == max(x.total_ms for x in r.layers)
    assert {x.op_type for x in top} == {"Gemm"}
    assert len(r.top_layers(100)) == len(r.layers)


class Broken:
    name = "broken"

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        bad = np.full(len(items) - 1, 1.0)
        return LatencyPrediction(bad, bad, bad, ("x",) * (len(items) - 1))


def test_a_predictor_returning_the_wrong_shape_is_caught(gpus: list[DeviceSpec]) -> None:
    with pytest.raises(ValueError, match="broken"):
        estimates.estimate(blocks(1), gpus[:1], settings(), predictor=Broken())


def test_json_document_is_stable_and_serialisable(gpus: list[DeviceSpec]) -> None:
    s = settings(precision="fp16")
    results = estimates.estimate(blocks(2), gpus, s, predictor=Recording(), epochs=1,
                                dataset_size=320)
    doc = json_documents.estimate_json(blocks(2), results, s, predictor_source="roofline", epochs=1,
                           dataset_size=320, include_layers=True)
    round_trip = json.loads(json.dumps(doc))
    assert round_trip["schema_version"] == json_documents.SCHEMA_VERSION
    assert round_trip["settings"]["precision"] == "fp16"
    dev = round_trip["devices"][0]
    assert set(dev) >= {"device", "forward_ms", "backward_ms", "optimizer_ms", "step_time_ms",
                        "memory_bytes", "memory", "fits", "predictor", "interval_ms",
                        "uncovered_ops", "layers", "epoch_seconds", "total_seconds"}
    assert dev["memory_bytes"] == dev["memory"]["total_bytes"]
    assert set(dev["interval_ms"]) == {"p10", "p90"}
    assert len(dev["layers"]) == 4 + 1  # two blocks of two layers, and the training loss
    brief = json_documents.estimate_json(blocks(2), results, s, predictor_source="roofline")
    assert "layers" not in brief["devices"][0]
