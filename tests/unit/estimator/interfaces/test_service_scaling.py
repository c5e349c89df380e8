"""The service refits the multi-GPU scaling model from job outcomes in a real SQLite database:
at start-up, after an outcome carrying the scaling fields, into every plan; a failing refit
keeps the model in use and says so on /metrics."""

from __future__ import annotations

import asyncio
import dataclasses
import pathlib
import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator.core import errors
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service, wire
from gpuplan_estimator.parallel import scaling
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import calibrating
from gpuplan_testing.contexts import roofline_context

L4 = {"gpu_type": "NVIDIA-L4", "gpus_per_node": 4, "nodes": 1, "free_gpus": 4}
# Runs timed by a known scaling model far from the analytic defaults.
TRUTH = scaling.ScalingModel(overlap=0.1, bandwidth_efficiency=0.25, hop_latency_us=10.0)
FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS, INTRA_GBPS, STEPS = 40.0, 80.0, 5.0, 64.0, 100
WAIT_S = 60.0


def run_of(gpu_count: int, gradient_bytes: int) -> dict[str, Any]:
    """A job's scaling fields (the model's own parts) and its actual seconds under TRUTH."""
    ar = TRUTH.allreduce_ms(gradient_bytes=gradient_bytes, gpu_count=gpu_count,
                            gpus_per_node=4, intra_node_gbps=INTRA_GBPS)
    step = TRUTH.step_time_ms(compute_ms=FORWARD_MS + BACKWARD_MS, backward_ms=BACKWARD_MS,
                              optimizer_ms=OPTIMIZER_MS, allreduce_ms=ar)
    return {"gpu_count": gpu_count, "gpus_per_node": gpu_count, "nodes": 1, "per_gpu_batch": 8,
            "steps": STEPS, "forward_ms": FORWARD_MS, "backward_ms": BACKWARD_MS,
            "optimizer_ms": OPTIMIZER_MS, "gradient_bytes": gradient_bytes,
            "intra_node_gbps": INTRA_GBPS, "actual_seconds": step * STEPS / 1000.0}


def plan_body() -> dict[str, Any]:
    return {"model_hf_config": {"model_type": "gpt2", "n_layer": 2, "n_embd": 256,
                                "n_head": 4, "vocab_size": 1000, "n_positions": 128},
            "training": {"batch_size": 8, "dataset_size": 800, "epochs": 1,
                         "dims": {"sequence": 128}},
            "objective": {"prefer": "fastest", "max_gpus": 4}, "inventory": [L4]}


async def wait_for(client: TestClient, ready: Any) -> dict[str, Any]:
    """/v1/models once `ready(models)` holds (the scaling refit after an outcome runs in the
    background)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        models: dict[str, Any] = await (await client.get("/v1/models")).json()
        if ready(models) or time.monotonic() > deadline:
            return models
        await asyncio.sleep(0.1)


def metric(text: str, name: str) -> float:
    [line] = [ln for ln in text.splitlines() if ln.startswith(name + " ")]
    return float(line.split()[1])


def test_an_outcome_with_scaling_fields_refits_the_model_the_next_plan_uses(
        tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url) as store:
        for uid, (n, grad) in {"a": (2, 10**9), "b": (4, 2 * 10**9)}.items():
            fields = run_of(n, grad)
            store.record_job_outcome(job_uid=uid, device="l4", estimated_seconds=10.0,
                                     **fields)
    third = run_of(4, 4 * 10**9)
    factor = 2.0  # the plan was calibrated: its parts (and estimate) are the model's x 2
    body = {"job_uid": "c", "gpu_type": "NVIDIA-L4", "gpu_count": 4,
            "estimated_seconds": 20.0, "actual_seconds": third["actual_seconds"],
            "calibration_factor": factor,
            **{k: v * factor if k.endswith("_ms") else v for k, v in third.items()
               if k not in {"gpu_count", "actual_seconds"}}}

    async def main() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], str]:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600, workers=1),
                               outcome_sink=serving.perfdb_outcome_sink(url),
                               outcome_history=serving.perfdb_outcome_history(url),
                               scaling_history=serving.perfdb_scaling_history(url))
        async with TestClient(TestServer(app)) as client:
            before = await (await client.get("/v1/models")).json()
            bad = await client.post("/v1/outcomes", json={**body, "steps": 0,
                                                          "gradient_bytes": -1,
                                                          "intra_node_gbps": "fast"})
            assert bad.status == 422
            assert [d["field"] for d in (await bad.json())["error"]["details"]] == [
                "steps", "gradient_bytes", "intra_node_gbps"]
            resp = await client.post("/v1/outcomes", json=body)
            assert resp.status == 201, await resp.text()
            after = await wait_for(client, lambda m: m["scaling"]["samples"] == 3)
            planned = await client.post("/v1/plans", json=plan_body())
            assert planned.status == 200, await planned.text()
            text = await (await client.get("/metrics")).text()
            return before, after, await planned.json(), text

    before, after, plan, text = asyncio.run(main())
    # Start-up: two runs, fewer than a fit needs.
    assert before["scaling"]["source"] == "analytic"
    assert before["scaling"]["samples"] == 2
    assert "a fit needs 3" in before["scaling"]["reason"]
    got = after["scaling"]
    assert (got["source"], got["samples"], got["stale"]) == ("fitted", 3, False)
    assert got["held_out_error_pct"] < got["analytic_error_pct"]
    assert got["inter_node_source"] == "default"
    assert (metric(text, "gpuplan_estimator_scaling_samples"),
            metric(text, "gpuplan_estimator_scaling_fitted"),
            metric(text, "gpuplan_estimator_scaling_stale")) == (3.0, 1.0, 0.0)
    # The stored parts are the model's own: the plan's factor divided out.
    row = PerfStore.open(url).job_outcomes(job_uid="c").iloc[0]
    assert (row["forward_ms"], row["backward_ms"], row["optimizer_ms"], row["steps"]) == (
        FORWARD_MS, BACKWARD_MS, OPTIMIZER_MS, STEPS)
    # The plan's multi-GPU candidates use the fitted model (times the calibration factor).
    fitted = dataclasses.replace(
        scaling.ScalingModel(), overlap=got["overlap"],
        bandwidth_efficiency=got["bandwidth_efficiency"], hop_latency_us=got["hop_latency_us"],
        inter_node_gbps=got["inter_node_gbps"])
    ctx = dataclasses.replace(roofline_context(), scaling=fitted)
    expected = {c["gpu_count"]: c["allreduce_ms"] for c in json_documents.plan_request_json(
        wire.parse_plan_request(plan_body()), ctx)["candidates"]}
    analytic = {c["gpu_count"]: c["allreduce_ms"] for c in json_documents.plan_request_json(
        wire.parse_plan_request(plan_body()), roofline_context())["candidates"]}
    served = {c["gpu_count"]: c for c in plan["candidates"]}
    multi = [n for n in served if n > 1]
    assert multi
    for n in multi:
        c = served[n]
        assert c["allreduce_ms"] == pytest.approx(
            expected[n] * c["calibration"]["factor"], rel=1e-3), n
        assert expected[n] > 1.5 * analytic[n]  # efficiency 0.25 fitted, not 0.7 assumed


def test_a_failing_scaling_refit_keeps_the_model_in_use_and_says_so() -> None:
    reads: list[int] = []
    rows = [{"device": "l4", "estimated_seconds": 10.0, **run_of(n, g)}
            for n, g in ((2, 10**9), (4, 2 * 10**9), (4, 4 * 10**9), (2, 4 * 10**9))]

    def history() -> Sequence[Mapping[str, Any]]:
        reads.append(len(reads))
        if len(reads) > 1:
            raise errors.DatabaseError("database unreachable")
        return rows

    def sink(req: wire.OutcomeRequest, device: str) -> tuple[int, bool]:
        return 1, True

    def no_outcomes() -> list[calibrating.Outcome]:
        return []

    async def main() -> tuple[dict[str, Any], dict[str, Any], str]:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600),
                               outcome_sink=sink, outcome_history=no_outcomes,
                               scaling_history=history)
        async with TestClient(TestServer(app)) as client:
            first = await (await client.get("/v1/models")).json()
            resp = await client.post("/v1/outcomes", json={
                "job_uid": "u1", "gpu_type": "NVIDIA-L4", "gpu_count": 2,
                "estimated_seconds": 10.0, "actual_seconds": 20.0})
            assert resp.status == 201, await resp.text()
            after = await wait_for(client, lambda m: m["scaling"]["stale"])
            return first, after, await (await client.get("/metrics")).text()

    first, after, text = asyncio.run(main())
    assert first["scaling"]["source"] == "fitted"
    assert after["scaling"]["stale"] is True
    assert {k: v for k, v in after["scaling"].items() if k != "stale"} == {
        k: v for k, v in first["scaling"].items() if k != "stale"}
    assert metric(text, "gpuplan_estimator_scaling_stale") == 1.0
    assert metric(text, "gpuplan_estimator_scaling_refit_failures_total") == 1.0
    assert len(reads) == 2


def test_without_a_database_plans_use_the_analytic_scaling() -> None:
    async def main() -> dict[str, Any]:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600))
        async with TestClient(TestServer(app)) as client:
            return dict(await (await client.get("/v1/models")).json())

    got = asyncio.run(main())["scaling"]
    assert (got["source"], got["samples"], got["stale"]) == ("analytic", 0, False)
