"""How the estimator priced the attention reaches status.plan.attention (issue #30 part 3):
parsed strictly, admitted by the CRD's schema, kept across a restart; an older estimator's
answer (no `attention`) or an older stored plan has none."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_estimator.core import options
from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, resources
from gpuplan_testing import crd_schema
from gpuplan_testing.operator_builders import make_plan

BARE: dict[str, Any] = {"gpu_type": "NVIDIA-H100-80GB-HBM3", "gpu_count": 1, "gpus_per_node": 1,
                        "nodes": 1, "estimated_seconds": 100.0, "step_time_ms": 10.0,
                        "memory_bytes_per_gpu": 1000, "predictor": "learned"}
NOT_FOUND = {"requested": "fused", "cores": 0, "fused_cores": 0, "unfused_scores": 0,
             "warning": "fused attention was asked for, but no attention core was found"}


def _parse(attention: object) -> resources.StatusPlan:
    return estimator_client.parse_plan({"plan": BARE, "attention": attention}, generation=1)


def test_the_crd_admits_the_attentions_the_estimator_knows() -> None:
    schema = crd_schema.status_plan_schema()["properties"]["attention"]
    assert tuple(schema["properties"]["requested"]["enum"]) == options.ATTENTIONS
    assert schema["properties"]["warning"]["maxLength"] == resources.ATTENTION_WARNING_MAX_CHARS


@pytest.mark.parametrize("answer", [NOT_FOUND, {**NOT_FOUND, "cores": 3, "fused_cores": 3,
                                                "warning": None}])
def test_the_attention_round_trips_through_status_under_the_schema(
        answer: dict[str, Any]) -> None:
    plan = _parse(answer)
    status = plan.to_status()
    assert status["attention"]["fusedCores"] == answer["fused_cores"]
    assert crd_schema.problems(status, crd_schema.status_plan_schema()) == []
    assert resources.StatusPlan.from_status(status) == plan
    said = plan.attention_warning()
    assert said == (None if answer["warning"] is None
                    else f"attention not fused: {answer['warning']}")


def test_an_older_estimator_or_stored_plan_has_no_attention() -> None:
    plan = _parse(None)
    assert plan.attention is None and "attention" not in plan.to_status()
    assert plan.attention_warning() is None
    assert resources.StatusPlan.from_status(make_plan().to_status()).attention is None


def test_a_long_warning_is_cut_to_what_the_schema_admits() -> None:
    plan = _parse({**NOT_FOUND, "warning": "x" * 5000})
    assert plan.attention is not None and plan.attention.warning is not None
    assert len(plan.attention.warning) == resources.ATTENTION_WARNING_MAX_CHARS
    assert crd_schema.problems(plan.to_status(), crd_schema.status_plan_schema()) == []


@pytest.mark.parametrize(("bad", "field"), [
    ("fused", "attention"), ({**NOT_FOUND, "requested": "flash"}, "attention.requested"),
    ({**NOT_FOUND, "cores": -1}, "attention.cores"),
    ({**NOT_FOUND, "fused_cores": True}, "attention.fused_cores"),
    ({**NOT_FOUND, "warning": 3}, "attention.warning")])
def test_a_malformed_attention_is_a_protocol_error_naming_the_field(bad: object,
                                                                    field: str) -> None:
    with pytest.raises(errors.EstimatorProtocolError, match=field):
        _parse(bad)
