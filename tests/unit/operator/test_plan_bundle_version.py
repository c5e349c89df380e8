"""The estimator's bundle_version (issue #17) reaches status.plan.bundleVersion under the CRD's
schema, survives a restart (from_status) and is named in the Estimated message."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, resources
from gpuplan_testing import crd_schema
from gpuplan_testing.operator_builders import make_plan

BARE: dict[str, Any] = {"gpu_type": "NVIDIA-L4", "gpu_count": 1, "gpus_per_node": 1, "nodes": 1,
                        "estimated_seconds": 100.0, "step_time_ms": 10.0,
                        "memory_bytes_per_gpu": 1000, "predictor": "learned"}


def _parse(**top: Any) -> resources.StatusPlan:
    return estimator_client.parse_plan({"plan": BARE, **top}, generation=1)


def test_the_bundle_version_round_trips_through_status_under_the_schema() -> None:
    plan = _parse(bundle_version=4)
    assert plan.bundle_version == 4
    status = plan.to_status()
    assert status["bundleVersion"] == 4
    assert crd_schema.problems(status, crd_schema.status_plan_schema()) == []
    assert resources.StatusPlan.from_status(status) == plan
    assert plan.predictor_summary() == "predictor learned, bundle version 4"


@pytest.mark.parametrize("top", [{"bundle_version": None}, {}], ids=["null", "absent"])
def test_a_file_bundle_or_older_estimator_gives_none(top: dict[str, Any]) -> None:
    plan = _parse(**top)
    assert plan.bundle_version is None
    assert "bundleVersion" not in plan.to_status()
    assert plan.predictor_summary() == "predictor learned"
    # Plans stored before issue #17 read back without one.
    assert resources.StatusPlan.from_status(make_plan().to_status()).bundle_version is None


@pytest.mark.parametrize("bad", [0, -1, "4", 2.5, True])
def test_a_bad_bundle_version_is_a_protocol_error(bad: object) -> None:
    with pytest.raises(errors.EstimatorProtocolError, match="bundle_version"):
        _parse(bundle_version=bad)


def test_the_schema_refuses_a_version_below_one() -> None:
    status = _parse(bundle_version=1).to_status()
    status["bundleVersion"] = 0
    assert crd_schema.problems(status, crd_schema.status_plan_schema()) == [
        ".bundleVersion: 0 breaks minimum 1"]
