"""The plan says what its estimate rests on (issue #18 part 3): the estimator's `data_basis`
reaches status.plan.dataBasis and each alternative under the CRD's schema, survives a restart
and is said in the Estimated message."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_estimator.latency import basis
from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, resources
from gpuplan_testing import crd_schema
from gpuplan_testing.operator_builders import make_plan

BARE: dict[str, Any] = {"gpu_type": "NVIDIA-H100-80GB-HBM3", "gpu_count": 1, "gpus_per_node": 1,
                        "nodes": 1, "estimated_seconds": 100.0, "step_time_ms": 10.0,
                        "memory_bytes_per_gpu": 1000, "predictor": "learned"}


def _parse(data_basis: object, **top: Any) -> resources.StatusPlan:
    plan = {**BARE, "data_basis": data_basis} if data_basis is not None else BARE
    return estimator_client.parse_plan({"plan": plan, **top}, generation=1)


def test_the_operator_knows_the_estimators_bases_and_the_crd_admits_them() -> None:
    assert resources.DATA_BASES == basis.BASES
    schema = crd_schema.status_plan_schema()["properties"]["dataBasis"]
    assert tuple(schema["enum"]) == basis.BASES


@pytest.mark.parametrize("label", basis.BASES)
def test_the_basis_round_trips_through_status_under_the_schema(label: str) -> None:
    plan = _parse(label, candidates=[{"gpu_type": "NVIDIA-L4", "gpu_count": 2,
                                      "estimated_seconds": 90.0, "data_basis": "measured"}])
    status = plan.to_status()
    assert status["dataBasis"] == label
    assert status["alternatives"][0]["dataBasis"] == "measured"
    assert crd_schema.problems(status, crd_schema.status_plan_schema()) == []
    assert resources.StatusPlan.from_status(status) == plan
    assert plan.predictor_summary().endswith(resources.DATA_BASIS_PHRASES[label])


def test_an_older_estimator_or_stored_plan_has_no_basis() -> None:
    plan = _parse(None)
    assert plan.data_basis is None and "dataBasis" not in plan.to_status()
    assert plan.predictor_summary() == "predictor learned"
    assert resources.StatusPlan.from_status(make_plan().to_status()).data_basis is None


@pytest.mark.parametrize("bad", ["guessed", 3, ""])
def test_an_unknown_basis_is_a_protocol_error_naming_the_field(bad: object) -> None:
    with pytest.raises(errors.EstimatorProtocolError, match="data_basis"):
        _parse(bad)


def test_the_schema_refuses_an_unknown_basis() -> None:
    status = _parse("measured").to_status()
    status["dataBasis"] = "guessed"
    (problem,) = crd_schema.problems(status, crd_schema.status_plan_schema())
    assert problem.startswith(".dataBasis")
