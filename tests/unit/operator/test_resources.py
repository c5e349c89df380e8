"""Condition helpers, plan round-trip and drift."""

from __future__ import annotations

import dataclasses
import datetime

from gpuplan_operator.core import resources
from gpuplan_testing.operator_builders import make_plan

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
T1 = T0 + datetime.timedelta(minutes=5)


def test_transition_time_moves_only_when_status_changes() -> None:
    c1 = resources.set_condition([], type_="Estimated", status=False, reason="EstimatorUnavailable",
                                 message="down", observed_generation=1, now=T0)
    c2 = resources.set_condition(c1, type_="Estimated", status=False, reason="EstimatorUnavailable",
                                 message="still down", observed_generation=1, now=T1)
    assert c2[0]["lastTransitionTime"] == "2026-01-01T00:00:00Z"
    assert c2[0]["message"] == "still down"
    c3 = resources.set_condition(c2, type_="Estimated", status=True, reason="Planned",
                                 message="ok", observed_generation=2, now=T1)
    assert c3 == [{"type": "Estimated", "status": "True", "reason": "Planned", "message": "ok",
                   "observedGeneration": 2, "lastTransitionTime": "2026-01-01T00:05:00Z"}]


def test_other_conditions_are_kept() -> None:
    c = resources.set_condition([], type_="Estimated", status=True, reason="Planned", message="",
                                observed_generation=1, now=T0)
    c = resources.set_condition(c, type_="Launched", status=True, reason="JobCreated", message="",
                                observed_generation=1, now=T0)
    assert [x["type"] for x in c] == ["Estimated", "Launched"]
    assert resources.is_true(c, "Launched") and not resources.is_true(c, "Succeeded")


def test_plan_round_trips_through_status() -> None:
    plan = make_plan(gpu_count=16, gpus_per_node=8, nodes=2, generation=3)
    assert resources.StatusPlan.from_status(plan.to_status()) == plan
    assert plan.multi_node


def test_calibration_factor_round_trips_and_old_plans_were_uncalibrated() -> None:
    plan = dataclasses.replace(make_plan(), calibration_factor=1.25)
    status = plan.to_status()
    assert status["calibrationFactor"] == 1.25
    assert resources.StatusPlan.from_status(status) == plan
    del status["calibrationFactor"]  # stored by an operator that predates calibration
    assert resources.StatusPlan.from_status(status).calibration_factor == 1.0


def test_drift_and_actual() -> None:
    actual = resources.Actual(T0, T1)
    assert actual.seconds == 300
    assert actual.to_status()["completionTime"] == "2026-01-01T00:05:00Z"
    assert resources.drift_ratio(300, 600) == 0.5
    assert resources.drift_ratio(300, 0) is None
