"""Finished jobs go back to the estimator as calibration samples."""

import asyncio
import base64
import dataclasses
import functools
import pathlib
import socket

import onnx
import pytest
from aiohttp import web

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import DatabaseError
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service, storage, wire, work
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import planner
from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, resources
from gpuplan_testing.operator_builders import LocalServer

PLAN = resources.StatusPlan(
    gpu_type="NVIDIA-L4", device="l4", gpu_count=2, gpus_per_node=2, nodes=1,
    estimated_seconds=100.0, step_time_ms=10.0, memory_bytes_per_gpu=2**30, cost_usd=1.0,
    predictor="roofline", observed_generation=1,
)
RESNET50 = (pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
            / "light_resnet50.onnx")


def test_outcome_body_carries_plan_and_actual() -> None:
    body = estimator_client.build_outcome(job_uid="u1", plan=PLAN, actual_seconds=130.0)
    assert body == {"job_uid": "u1", "gpu_type": "NVIDIA-L4", "gpu_count": 2,
                    "estimated_seconds": 100.0, "actual_seconds": 130.0,
                    "calibration_factor": 1.0, "gpus_per_node": 2, "nodes": 1}


def test_outcome_body_carries_the_factor_the_plan_was_calibrated_with() -> None:
    plan = dataclasses.replace(PLAN, estimated_seconds=150.0, calibration_factor=1.5)
    body = estimator_client.build_outcome(job_uid="u1", plan=plan, actual_seconds=160.0)
    assert (body["estimated_seconds"], body["calibration_factor"]) == (150.0, 1.5)


def test_unreachable_estimator_is_a_typed_error() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = estimator_client.build_outcome(job_uid="u1", plan=PLAN, actual_seconds=1.0)
    with pytest.raises(errors.EstimatorUnavailableError, match="/v1/outcomes"):
        asyncio.run(estimator_client.report_outcome(f"http://127.0.0.1:{port}", body,
                                                    timeout_seconds=2))


def _roofline_service(url: str, outcome_sink: storage.OutcomeSink) -> web.Application:
    """`gpuplan serve`'s app on the roofline, calibrating from the database at `url`."""
    context = planner.PlannerContext(catalog=devices.load_catalog(),
                                     predictor=roofline.RooflinePredictor(),
                                     predictor_source="roofline")
    return service.make_app(service.ServiceState(functools.partial(work.given_context, context)),
                            service.ServiceSettings(bundle_poll_s=3600),
                            outcome_sink=outcome_sink,
                            outcome_history=serving.perfdb_outcome_history(url))


def test_calibrated_plans_feed_back_the_models_own_estimate(tmp_path: pathlib.Path) -> None:
    """Operator client ↔ the real estimator service and SQLite: a job planned after earlier
    outcomes were learned is stored against the uncalibrated estimate, never counted twice."""
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url) as store:
        for i in range(3):
            store.record_job_outcome(job_uid=f"old{i}", device="l4", gpu_count=1,
                                     estimated_seconds=100.0, actual_seconds=150.0)
    app = _roofline_service(url, serving.perfdb_outcome_sink(url))
    body = {"model_onnx_b64": base64.b64encode(RESNET50.read_bytes()).decode(),
            "training": {"batch_size": 1, "dataset_size": 1000, "epochs": 1,
                         "optimizer": "sgd", "dims": {}},
            "objective": {"prefer": "cheapest", "max_gpus": 1},
            "inventory": [{"gpu_type": "NVIDIA-L4", "gpus_per_node": 1, "nodes": 1,
                           "free_gpus": 1}],
            "gpu_types": []}

    async def main() -> resources.StatusPlan:
        async with LocalServer(app) as srv:
            plan = await estimator_client.request_plan(srv.url, body, generation=1,
                                                       timeout_seconds=30, tenant="default")
            # The plan survives an operator restart through status.plan.
            plan = resources.StatusPlan.from_status(plan.to_status())
            outcome = estimator_client.build_outcome(
                job_uid="new", plan=plan, actual_seconds=plan.estimated_seconds)
            await estimator_client.report_outcome(srv.url, outcome, timeout_seconds=30)
            return plan

    plan = asyncio.run(main())
    assert plan.data_basis == "roofline"  # the real service's answer says what it rests on
    assert 1.0 < plan.calibration_factor < 1.5
    row = PerfStore.open(url).job_outcomes(job_uid="new")
    assert float(row["estimated_seconds"].iloc[0]) == pytest.approx(
        plan.estimated_seconds / plan.calibration_factor)
    # The job took exactly the calibrated estimate: against the model it ran slow by the factor.
    assert float(row["drift_ratio"].iloc[0]) == pytest.approx(plan.calibration_factor)


def test_an_outcome_refused_while_the_database_is_busy_is_sent_again_and_stored_once(
        tmp_path: pathlib.Path) -> None:
    """The real service answers 503 DatabaseUnavailable while its database fails; the operator
    sends the outcome again after a backoff and it is stored once (the helm install test lost
    one outcome in three runs to a single 503)."""
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    stored = serving.perfdb_outcome_sink(url)
    failures = [DatabaseError("performance database unavailable: database is locked")]

    def flaky_sink(req: wire.OutcomeRequest, device: str) -> tuple[int, bool]:
        if failures:
            raise failures.pop()
        return stored(req, device)

    app = _roofline_service(url, flaky_sink)
    waits: list[float] = []

    async def no_wait(seconds: float) -> None:
        waits.append(seconds)

    async def main() -> None:
        async with LocalServer(app) as srv:
            body = estimator_client.build_outcome(job_uid="u1", plan=PLAN, actual_seconds=90.0)
            await estimator_client.report_outcome(srv.url, body, timeout_seconds=10,
                                                  deadline_seconds=60, sleep=no_wait)

    asyncio.run(main())
    assert waits == [estimator_client.FIRST_OUTCOME_RETRY_DELAY_S]
    assert len(PerfStore.open(url).job_outcomes(job_uid="u1")) == 1



def test_the_outcome_names_the_trainingjobs_namespace_for_the_calibration_share() -> None:
    body = estimator_client.build_outcome(job_uid="u1", plan=PLAN, actual_seconds=130.0,
                                          namespace="team-a")
    assert body["namespace"] == "team-a"
    assert wire.parse_outcome_request(body).namespace == "team-a"
    assert "namespace" not in estimator_client.build_outcome(job_uid="u1", plan=PLAN,
                                                             actual_seconds=130.0)
