"""Outcomes carry what the estimator's scaling fit needs: the plan's per-step figures, read
from its answer, kept through status.plan, sent with the outcome and stored by the real
estimator service in SQLite (issue #19)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
import pathlib
from typing import Any

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service, work
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import planner
from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, resources, validation
from gpuplan_testing.operator_builders import LocalServer, SpecBuilder

ANSWER: dict[str, Any] = {"plan": {
    "gpu_type": "NVIDIA-L4", "device": "l4", "gpu_count": 8, "gpus_per_node": 4, "nodes": 2,
    "per_gpu_batch": 16, "estimated_seconds": 7200.0, "step_time_ms": 250.0,
    "memory_bytes_per_gpu": 2 * 10**10, "cost_usd": 9.5, "predictor": "roofline",
    "calibration": {"factor": 1.5, "outcomes": 3, "level": "device+mode"},
    # What planner.candidate_json is to add (issue #19): the plan's per-step parts etc.
    "steps": 28_800, "forward_ms": 60.0, "backward_ms": 120.0, "optimizer_ms": 7.5,
    "gradient_bytes": 102_228_128, "intra_node_gbps": 64.0}}
INPUTS = resources.ScalingInputs(per_gpu_batch=16, steps=28_800, forward_ms=60.0,
                                 backward_ms=120.0, optimizer_ms=7.5,
                                 gradient_bytes=102_228_128, intra_node_gbps=64.0)


def test_the_plans_scaling_inputs_are_read_and_kept_through_status() -> None:
    plan = estimator_client.parse_plan(ANSWER, generation=1)
    assert plan.scaling_inputs == INPUTS
    status = plan.to_status()
    assert status["scalingInputs"] == {"perGpuBatch": 16, "steps": 28_800, "forwardMs": 60.0,
                                       "backwardMs": 120.0, "optimizerMs": 7.5,
                                       "gradientBytes": 102_228_128, "intraNodeGbps": 64.0}
    assert resources.StatusPlan.from_status(status) == plan


def test_an_estimator_without_them_gives_none_and_old_status_reads_as_none() -> None:
    bare = {"plan": {k: v for k, v in ANSWER["plan"].items()
                     if k in {"gpu_type", "gpu_count", "gpus_per_node", "nodes",
                              "estimated_seconds", "step_time_ms", "memory_bytes_per_gpu"}}}
    plan = estimator_client.parse_plan(bare, generation=1)
    assert plan.scaling_inputs == resources.ScalingInputs()
    assert "scalingInputs" not in plan.to_status()
    assert resources.StatusPlan.from_status(plan.to_status()).scaling_inputs == (
        resources.ScalingInputs())


@pytest.mark.parametrize(("key", "value"), [
    ("steps", 1.5), ("gradient_bytes", -1), ("forward_ms", "60"), ("backward_ms", math.inf),
    ("intra_node_gbps", True), ("per_gpu_batch", math.nan)])
def test_a_malformed_input_is_a_protocol_error_naming_it(key: str, value: Any) -> None:
    with pytest.raises(errors.EstimatorProtocolError, match=key):
        estimator_client.parse_plan({"plan": {**ANSWER["plan"], key: value}}, generation=1)


def test_steps_come_from_the_spec_when_the_plan_does_not_say() -> None:
    spec = validation.parse_spec(SpecBuilder().set("training.batchSize", 256)
                                 .set("training.datasetSize", 1_281_167)
                                 .set("training.epochs", 90).obj())
    plan = estimator_client.parse_plan(
        {"plan": {k: v for k, v in ANSWER["plan"].items() if k != "steps"}}, generation=1)
    got = estimator_client.with_planned_steps(plan, spec.training)
    assert got.scaling_inputs.steps == math.ceil(1_281_167 / 256) * 90 == 450_450
    given = estimator_client.parse_plan(ANSWER, generation=1)
    assert estimator_client.with_planned_steps(given, spec.training) == given


def test_the_outcome_payload_carries_node_shape_and_inputs() -> None:
    plan = estimator_client.parse_plan(ANSWER, generation=1)
    body = estimator_client.build_outcome(job_uid="u1", plan=plan, actual_seconds=8000.0)
    assert body == {"job_uid": "u1", "gpu_type": "NVIDIA-L4", "gpu_count": 8,
                    "estimated_seconds": 7200.0, "actual_seconds": 8000.0,
                    "calibration_factor": 1.5, "gpus_per_node": 4, "nodes": 2,
                    "per_gpu_batch": 16, "steps": 28_800, "forward_ms": 60.0,
                    "backward_ms": 120.0, "optimizer_ms": 7.5, "gradient_bytes": 102_228_128,
                    "intra_node_gbps": 64.0}


def test_the_real_service_stores_the_models_own_parts(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    context = planner.PlannerContext(catalog=devices.load_catalog(),
                                     predictor=roofline.RooflinePredictor(),
                                     predictor_source="roofline")
    app = service.make_app(service.ServiceState(functools.partial(work.given_context, context)),
                           service.ServiceSettings(bundle_poll_s=3600),
                           outcome_sink=serving.perfdb_outcome_sink(url))
    # A plan as the operator keeps it (status.plan) from an answer with every input.
    plan = resources.StatusPlan.from_status(estimator_client.parse_plan(ANSWER, generation=1)
                                      .to_status())
    old = dataclasses.replace(plan, scaling_inputs=resources.ScalingInputs())

    async def main() -> None:
        async with LocalServer(app) as srv:
            for uid, p in (("new", plan), ("old", old)):
                body = estimator_client.build_outcome(job_uid=uid, plan=p, actual_seconds=8e3)
                await estimator_client.report_outcome(srv.url, body, timeout_seconds=30)

    asyncio.run(main())
    rows = PerfStore.open(url).job_outcomes().set_index("job_uid")
    new = rows.loc["new"]
    # The plan's figures were calibrated by 1.5; the database keeps the model's own.
    assert (new["forward_ms"], new["backward_ms"], new["optimizer_ms"]) == (40.0, 80.0, 5.0)
    assert (new["gpus_per_node"], new["nodes"], new["per_gpu_batch"], new["steps"],
            new["gradient_bytes"], new["intra_node_gbps"]) == (4, 2, 16, 28_800,
                                                               102_228_128, 64.0)
    assert rows.loc["old", "gpus_per_node"] == 4
    assert math.isnan(rows.loc["old", "forward_ms"])
