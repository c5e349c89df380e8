"""Job outcomes calibrate plans and estimates: the pure engine, then the service over a real
SQLite performance database."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import pathlib
from typing import Any

import onnx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator.core import errors
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service, wire
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import calibrating, planner
from gpuplan_testing import contexts
from gpuplan_testing.contexts import roofline_context

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RESNET50_B64 = base64.b64encode((LIGHT / "light_resnet50.onnx").read_bytes()).decode()
L4 = {"gpu_type": "NVIDIA-L4", "gpus_per_node": 4, "nodes": 1, "free_gpus": 4}
# Three training jobs on L4 that took twice what the model predicted.
SLOW_L4 = [calibrating.Outcome("l4", "train", 1000.0, 2000.0, model=f"m{i}") for i in range(3)]


def plan_body(*, max_gpus: int = 4) -> dict[str, Any]:
    return {
        "model_onnx_b64": RESNET50_B64,
        "training": {"batch_size": 12, "dataset_size": 1200, "epochs": 1, "optimizer": "sgd"},
        "objective": {"prefer": "cheapest", "max_gpus": max_gpus},
        "inventory": [L4],
    }


def plan(ctx: planner.PlannerContext, *, max_gpus: int = 4) -> dict[str, Any]:
    return json_documents.plan_request_json(
        wire.parse_plan_request(plan_body(max_gpus=max_gpus)), ctx)


def by_count(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {c["gpu_count"]: c for c in doc["candidates"]}


def test_a_fitted_calibration_scales_every_candidate_and_is_reported() -> None:
    raw_ctx = roofline_context()
    fitted = calibrating.fit(SLOW_L4)
    factor = fitted.correction("l4", "train").factor
    assert 1.0 < factor < 2.0  # three outcomes move it most of the way, not all of it
    raw = by_count(plan(raw_ctx))
    calibrated = by_count(plan(dataclasses.replace(raw_ctx, calibration=fitted)))
    assert sorted(calibrated) == sorted(raw) == [1, 2, 3, 4]
    for n, c in calibrated.items():
        r = raw[n]
        assert r["calibration"] == {"factor": 1.0, "outcomes": 0, "level": "none"}
        assert c["calibration"] == {"factor": factor, "outcomes": 3, "level": "device+mode"}
        # The all-reduce of multi-GPU counts too: the whole estimate is the model's × factor.
        for key in ("step_time_ms", "allreduce_ms", "estimated_seconds", "cost_usd"):
            assert c[key] == pytest.approx(r[key] * factor, rel=1e-4, abs=1e-3), (n, key)
        low, high = c["interval_seconds"]
        # The roofline has no interval of its own; the outcomes' spread gives it one.
        assert r["interval_seconds"] == pytest.approx([r["estimated_seconds"]] * 2, abs=2e-3)
        assert low < c["estimated_seconds"] < high
        assert c["memory_bytes_per_gpu"] == r["memory_bytes_per_gpu"]


def test_no_outcomes_leaves_plans_exactly_as_the_model_made_them() -> None:
    ctx = roofline_context()
    assert ctx.calibration == calibrating.CalibrationTable()
    assert plan(dataclasses.replace(ctx, calibration=calibrating.fit([]))) == plan(ctx)
    # Outcomes of another mode only reach training plans through the shrunk global factor.
    inference_only = calibrating.fit([dataclasses.replace(o, mode="inference") for o in SLOW_L4])
    got = plan(dataclasses.replace(ctx, calibration=inference_only), max_gpus=1)["plan"]
    assert got["calibration"]["level"] == "global"


def test_estimate_adds_calibrated_fields_next_to_the_models_own() -> None:
    fitted = calibrating.fit(SLOW_L4)
    body = {"model_onnx_b64": RESNET50_B64,
            "training": {"batch_size": 1, "dataset_size": 100, "epochs": 2},
            "devices": ["NVIDIA-L4", "Tesla T4"]}
    req = wire.parse_estimate_request(body)
    raw = json_documents.estimate_request_json(req, roofline_context())
    doc = json_documents.estimate_request_json(
        req, dataclasses.replace(roofline_context(), calibration=fitted))
    l4, t4 = doc["devices"]
    raw_l4, raw_t4 = raw["devices"]
    assert raw_l4["calibration"] == {"factor": 1.0, "outcomes": 0, "level": "none"}
    assert raw_l4["calibrated_step_time_ms"] == raw_l4["step_time_ms"]
    assert raw_l4["calibrated_interval_ms"] == raw_l4["interval_ms"]
    factor = fitted.correction("l4", "train").factor
    assert l4["calibration"] == {"factor": factor, "outcomes": 3, "level": "device+mode"}
    for key in ("step_time_ms", "interval_ms", "epoch_seconds", "total_seconds"):
        assert l4[key] == raw_l4[key]  # the model's own fields never change
    assert l4["calibrated_step_time_ms"] == pytest.approx(l4["step_time_ms"] * factor)
    assert l4["calibrated_total_seconds"] == pytest.approx(l4["total_seconds"] * factor)
    assert l4["calibrated_epoch_seconds"] == pytest.approx(l4["epoch_seconds"] * factor)
    p10, p90 = l4["calibrated_interval_ms"]["p10"], l4["calibrated_interval_ms"]["p90"]
    assert p10 < l4["calibrated_step_time_ms"] < p90
    # T4 has no outcomes of its own: it inherits the (shrunk) training factor.
    assert t4["calibration"]["level"] == "mode"
    assert 1.0 < t4["calibration"]["factor"] < factor
    assert raw_t4["step_time_ms"] == t4["step_time_ms"]


def outcome(job_uid: str, planned: dict[str, Any], actual_seconds: float) -> dict[str, Any]:
    """What the operator reports for a job that ran as `planned` (a /v1/plans `plan`)."""
    return {"job_uid": job_uid, "gpu_type": "NVIDIA-L4", "gpu_count": planned["gpu_count"],
            "estimated_seconds": planned["estimated_seconds"], "actual_seconds": actual_seconds,
            "calibration_factor": planned["calibration"]["factor"]}


def test_reported_outcomes_move_the_next_plan_through_a_real_database(
        tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"

    async def main() -> tuple[float, dict[str, Any]]:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600),
                               outcome_sink=serving.perfdb_outcome_sink(url),
                               outcome_history=serving.perfdb_outcome_history(url))
        async with TestClient(TestServer(app)) as client:
            first = (await (await client.post("/v1/plans", json=plan_body(max_gpus=1))).json())
            first_plan = first["plan"]
            assert first_plan["calibration"] == {"factor": 1.0, "outcomes": 0, "level": "none"}
            estimated = first_plan["estimated_seconds"]
            for uid in ("j1", "j2"):
                resp = await client.post("/v1/outcomes",
                                         json=outcome(uid, first_plan, 2 * estimated))
                assert resp.status == 201, await resp.text()
            resp = await client.post("/v1/plans", json=plan_body(max_gpus=1))
            second = (await resp.json())["plan"]
            factor = second["calibration"]["factor"]
            assert second["calibration"] == {"factor": factor, "outcomes": 2,
                                             "level": "device+mode"}
            assert 1.0 < factor < 2.0
            assert second["estimated_seconds"] == pytest.approx(estimated * factor, rel=1e-4)
            # A job run from the calibrated plan reports the factor it was planned with.
            resp = await client.post("/v1/outcomes",
                                     json=outcome("j3", second, 2 * estimated))
            assert resp.status == 201, await resp.text()
            models = await (await client.get("/v1/models")).json()
            assert models["calibration"]["outcomes"] == 3
            assert models["calibration"]["factors"]["l4/train"] > factor
            for bad in (0, -1.5, "2", True):
                resp = await client.post("/v1/outcomes", json={
                    **outcome("j4", second, 1.0), "calibration_factor": bad})
                assert resp.status == 422, bad
                err = (await resp.json())["error"]
                assert err["reason"] == "InvalidRequest"
                assert "calibration_factor" in err["message"]
            return estimated, second

    estimated, second = asyncio.run(main())
    rows = PerfStore.open(url).job_outcomes()
    assert list(rows["job_uid"]) == ["j1", "j2", "j3"]
    # Every row holds the model's own estimate: the calibrated one divided by its factor.
    assert rows["estimated_seconds"].tolist() == pytest.approx([estimated] * 3, rel=1e-4)
    assert float(rows["estimated_seconds"].iloc[2]) == pytest.approx(
        second["estimated_seconds"] / second["calibration"]["factor"])
    assert rows["drift_ratio"].tolist() == pytest.approx([2.0] * 3, rel=1e-4)


def test_calibration_is_read_at_start_and_survives_a_bundle_reload(
        tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url) as store:
        for i in range(3):
            store.record_job_outcome(job_uid=f"old{i}", device="l4", gpu_count=1,
                                     estimated_seconds=100.0, actual_seconds=200.0)
    name = tmp_path / "bundle-name"
    name.write_text("bundle-a")
    state = service.ServiceState(functools.partial(contexts.roofline_named_by_file, str(name)))

    async def main() -> None:
        app = service.make_app(state, service.ServiceSettings(bundle_poll_s=3600),
                               outcome_history=serving.perfdb_outcome_history(url))
        async with TestClient(TestServer(app)) as client:
            before = (await (await client.post("/v1/plans", json=plan_body())).json())["plan"]
            assert before["predictor"] == "bundle-a"
            assert before["calibration"]["outcomes"] == 3
            name.write_text("bundle-b")
            assert state.load() is True  # a newer bundle: a new context, the same calibration
            after = (await (await client.post("/v1/plans", json=plan_body())).json())["plan"]
            assert after["predictor"] == "bundle-b"
            assert after["calibration"] == before["calibration"]

    asyncio.run(main())


def test_a_failing_outcome_history_keeps_the_calibration_and_the_request_succeeds() -> None:
    reads: list[int] = []
    stored: list[wire.OutcomeRequest] = []

    def history() -> list[calibrating.Outcome]:
        reads.append(len(reads))
        if len(reads) > 1:
            raise errors.DatabaseError("database unreachable")
        return SLOW_L4

    def sink(req: wire.OutcomeRequest, device: str) -> tuple[int, bool]:
        stored.append(req)
        return len(stored), True

    async def main() -> None:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600),
                               outcome_sink=sink, outcome_history=history)
        async with TestClient(TestServer(app)) as client:
            models = await (await client.get("/v1/models")).json()
            assert models["calibration"]["outcomes"] == 3
            body = {"job_uid": "u1", "gpu_type": "NVIDIA-L4", "gpu_count": 1,
                    "estimated_seconds": 10.0, "actual_seconds": 20.0}
            resp = await client.post("/v1/outcomes", json=body)
            assert resp.status == 201, await resp.text()
            models = await (await client.get("/v1/models")).json()
            assert models["calibration"]["outcomes"] == 3

    asyncio.run(main())
    assert len(reads) == 2
    assert [r.calibration_factor for r in stored] == [1.0]  # an older operator sends none


def test_without_a_database_there_is_no_calibration() -> None:
    async def main() -> None:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600))
        async with TestClient(TestServer(app)) as client:
            models = await (await client.get("/v1/models")).json()
            assert models["calibration"] == {"outcomes": 0, "stale": False,
                                             "factors": {"*/*": 1.0}}

    asyncio.run(main())
