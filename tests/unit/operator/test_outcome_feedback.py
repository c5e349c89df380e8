"""Finished jobs go back to the estimator as calibration samples."""

import asyncio
import socket

import pytest

from gpuplan_operator import errors, estimator_client, resources

PLAN = resources.Plan(
    gpu_type="NVIDIA-L4", device="l4", gpu_count=2, gpus_per_node=2, nodes=1,
    estimated_seconds=100.0, step_time_ms=10.0, memory_bytes_per_gpu=2**30, cost_usd=1.0,
    predictor="roofline", observed_generation=1,
)


def test_outcome_body_carries_plan_and_actual() -> None:
    body = estimator_client.build_outcome(job_uid="u1", plan=PLAN, actual_seconds=130.0)
    assert body == {"job_uid": "u1", "gpu_type": "NVIDIA-L4", "gpu_count": 2,
                    "estimated_seconds": 100.0, "actual_seconds": 130.0}


def test_unreachable_estimator_is_a_typed_error() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    body = estimator_client.build_outcome(job_uid="u1", plan=PLAN, actual_seconds=1.0)
    with pytest.raises(errors.EstimatorUnavailableError, match="/v1/outcomes"):
        asyncio.run(estimator_client.report_outcome(f"http://127.0.0.1:{port}", body,
                                                    timeout_seconds=2))
