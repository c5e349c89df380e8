"""Plan workloads (issue #17): a plan keeps the chosen candidate's work items, priced again by
any bundle exactly as an estimate prices a step; the planning bundle gives back the planned
(uncalibrated) seconds, another bundle differs by what it prices; the storage form round-trips
and is capped, and a plan over the cap is still answered."""

from __future__ import annotations

import base64
import hashlib
import json
import pathlib
from pathlib import Path

import onnx
import pytest
import zstandard

from gpuplan_estimator import devices
from gpuplan_estimator.core import limits
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.cost.roofline import RooflinePredictor
from gpuplan_estimator.interfaces.http import work
from gpuplan_estimator.planning import estimates, planner, requests, workloads
from gpuplan_estimator.planning.placement import Objective
from gpuplan_estimator.step.decomposition import build_step
from gpuplan_testing import workload_builders as wb

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RESNET50 = (LIGHT / "light_resnet50.onnx").read_bytes()
TRAINING = requests.TrainingRequest(batch_size=8, dataset_size=4000, epochs=1, optimizer="sgd")


def _plan_request() -> requests.PlanRequest:
    return requests.PlanRequest(
        model_onnx=RESNET50, training=TRAINING,
        objective=Objective(prefer="cheapest", max_gpus=4),
        inventory=(requests.InventoryEntry("Tesla-T4", 4, 2, 8),), gpu_types=())


def _context(predictor: LatencyPredictor, source: str = "test") -> planner.PlannerContext:
    return planner.PlannerContext(catalog=devices.load_catalog(), predictor=predictor,
                                  predictor_source=source)


@pytest.fixture(scope="module")
def learned(tmp_path_factory: pytest.TempPathFactory) -> LatencyPredictor:
    return wb.predictor(wb.gpu_bundle(tmp_path_factory.mktemp("b") / "b", seed=3))


def test_items_reprice_like_the_estimate_of_the_same_step(learned: LatencyPredictor) -> None:
    spec = devices.load_catalog().resolve("t4")
    settings = planner.training_settings(TRAINING, 4)
    graph = planner.graph_at(RESNET50, TRAINING, 4)
    items = workloads.distinct_items(build_step(graph, settings).items)
    assert len(items) < len(build_step(graph, settings).items)  # merged: counts summed
    for predictor in (RooflinePredictor(), learned):
        (estimate,) = estimates.estimate(graph, [spec], settings, predictor=predictor)
        assert workloads.step_ms(items, predictor, spec) == pytest.approx(
            estimate.step_time_ms, rel=1e-9)


def test_the_planning_bundle_gives_back_the_planned_seconds_and_another_differs(
        learned: LatencyPredictor) -> None:
    ctx = _context(RooflinePredictor())
    out = work.plan_with_workload(_plan_request(), ctx)
    kept = out[work.WORKLOAD_KEY]
    data = base64.b64decode(kept["zstd_b64"])
    w = workloads.decode(data)
    text = zstandard.ZstdDecompressor().decompress(data)
    assert kept["id"] == hashlib.sha256(text).hexdigest()
    assert (kept["device"], kept["gpu_count"]) == (w.device, w.gpu_count)
    plan = out["plan"]
    assert (w.device, w.gpu_count, w.steps) == (plan["device"], plan["gpu_count"], plan["steps"])
    assert w.batch_size == plan["parallelism"]["micro_batch"]
    assert w.planned_seconds == plan["estimated_seconds"] / plan["calibration"]["factor"]
    # The planning predictor: the planned seconds again.
    assert workloads.repredict_seconds([w], ctx.predictor, ctx.catalog) == [
        pytest.approx(w.planned_seconds, rel=1e-12)]
    # Another: its step on the same items, over the planning one's, on the priced share.
    spec = ctx.catalog.resolve(w.device)
    graph = planner.graph_at(RESNET50, TRAINING, w.batch_size)
    (own,) = estimates.estimate(graph, [spec], planner.training_settings(TRAINING, w.batch_size),
                                predictor=learned)
    ratio = own.step_time_ms / w.reference_step_ms
    (seconds,) = workloads.repredict_seconds([w], learned, ctx.catalog)
    assert ratio != pytest.approx(1.0, abs=1e-3)
    assert seconds == pytest.approx(
        w.planned_seconds * (1 - w.bundle_share + w.bundle_share * ratio), rel=1e-9)


def test_storage_round_trips_and_workloads_on_several_devices_are_priced_apart(
        learned: LatencyPredictor) -> None:
    items = wb.softmax_items([(64, 512), (1024, 4096)])
    on_t4 = wb.workload(items, RooflinePredictor(), device="t4", bundle_share=0.8)
    on_l4 = wb.workload(items[:1], RooflinePredictor(), device="l4", planned_seconds=7.0)
    for w in (on_t4, on_l4):
        workload_id, data = workloads.encode(w)
        assert workloads.decode(data) == w
        assert workloads.encode(w)[0] == workload_id  # the same workload: the same id
    together = workloads.repredict_seconds([on_t4, on_l4], learned, devices.load_catalog())
    apart = [workloads.repredict_seconds([w], learned, devices.load_catalog())[0]
             for w in (on_t4, on_l4)]
    assert together == pytest.approx(apart, rel=1e-12)
    assert together[0] != pytest.approx(on_t4.planned_seconds, rel=1e-3)


def test_a_workload_over_the_cap_is_refused_and_the_plan_still_answered(
        monkeypatch: pytest.MonkeyPatch) -> None:
    w = wb.workload(wb.softmax_items([(8, 8)]), RooflinePredictor())
    with pytest.raises(workloads.WorkloadTooLargeError, match="over the 10-byte cap"):
        workloads.encode(w, limit_bytes=10)
    monkeypatch.setattr(limits, "MAX_WORKLOAD_BYTES", 200)
    out = work.plan_with_workload(_plan_request(), _context(RooflinePredictor()))
    assert out["plan"]["device"] == "t4"
    assert set(out[work.WORKLOAD_KEY]) == {"skipped"}
    assert "over the 200-byte cap: not stored" in out[work.WORKLOAD_KEY]["skipped"]


@pytest.mark.parametrize(("plan", "share"), [
    ({"step_ms": {"compute": 60.0, "recompute": 10.0, "pp_bubble": 5.0, "optimizer": 5.0,
                  "dp_comm": 15.0, "tp_comm": 5.0}, "step_time_ms": 100.0}, 0.8),
    ({"step_time_ms": 100.0, "forward_ms": 30.0, "backward_ms": 50.0, "optimizer_ms": 10.0},
     0.9),
    ({"step_time_ms": 50.0, "forward_ms": 30.0, "backward_ms": 50.0, "optimizer_ms": 10.0},
     1.0),
    ({"step_time_ms": 0.0}, 1.0),
])
def test_bundle_share_of_a_plan(plan: dict[str, object], share: float) -> None:
    assert workloads.bundle_share(plan) == pytest.approx(share)


def test_bytes_that_are_not_a_workload_are_named(tmp_path: Path) -> None:
    with pytest.raises(workloads.InvalidWorkloadError, match="not a stored workload"):
        workloads.decode(b"plain bytes")
    other = zstandard.ZstdCompressor().compress(json.dumps({"schema_version": 99}).encode())
    with pytest.raises(workloads.InvalidWorkloadError, match="schema 99"):
        workloads.decode(other)
