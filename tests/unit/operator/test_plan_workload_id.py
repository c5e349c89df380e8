"""The estimator's workload_id (issue #17) reaches status.plan.workloadId under the CRD's
schema, survives a restart (from_status) and goes back with the job's outcome, so the
promotion gate can re-estimate the job with each model bundle."""

from __future__ import annotations

import re
from typing import Any

import pytest

from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, resources
from gpuplan_testing import crd_schema
from gpuplan_testing.operator_builders import make_plan

from .test_plan_bundle_version import BARE

WORKLOAD_ID = "0123456789abcdef" * 4


def _parse(**top: Any) -> resources.StatusPlan:
    return estimator_client.parse_plan({"plan": BARE, **top}, generation=1)


def test_the_workload_id_round_trips_through_status_and_goes_with_the_outcome() -> None:
    plan = _parse(workload_id=WORKLOAD_ID)
    status = plan.to_status()
    assert status["workloadId"] == WORKLOAD_ID
    assert crd_schema.problems(status, crd_schema.status_plan_schema()) == []
    restored = resources.StatusPlan.from_status(status)
    assert restored == plan
    outcome = estimator_client.build_outcome(job_uid="u1", plan=restored, actual_seconds=90.0)
    assert outcome["workload_id"] == WORKLOAD_ID


@pytest.mark.parametrize("top", [{"workload_id": None}, {}], ids=["null", "absent"])
def test_no_database_or_an_older_estimator_sends_none(top: dict[str, Any]) -> None:
    plan = _parse(**top)
    assert plan.workload_id is None
    assert "workloadId" not in plan.to_status()
    assert "workload_id" not in estimator_client.build_outcome(
        job_uid="u1", plan=plan, actual_seconds=90.0)
    # Plans stored before issue #17's workloads read back without one.
    assert resources.StatusPlan.from_status(make_plan().to_status()).workload_id is None


@pytest.mark.parametrize("bad", ["abc", WORKLOAD_ID.upper(), 7, WORKLOAD_ID + "0"])
def test_a_bad_workload_id_is_a_protocol_error(bad: object) -> None:
    with pytest.raises(errors.EstimatorProtocolError, match="workload_id"):
        _parse(workload_id=bad)


def test_the_schema_pattern_admits_ids_only() -> None:
    # The test schema checker does not apply `pattern`; the API server does.
    pattern = re.compile(crd_schema.status_plan_schema()["properties"]["workloadId"]["pattern"])
    assert pattern.search(WORKLOAD_ID)
    assert not pattern.search("not-hex") and not pattern.search(WORKLOAD_ID + "0")
