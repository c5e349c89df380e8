"""Issue #33: a finished run is timed from the start of the attempt that finished, and a run
that was preempted, evicted, retried or requeued is labelled and calibrates nothing."""

from __future__ import annotations

import datetime
from typing import Any

import pytest

from gpuplan_operator.core import tracking

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def iso(seconds: float) -> str:
    return (T0 + datetime.timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(*, end_s: float, failed: int = 0) -> dict[str, Any]:
    return {"status": {"startTime": iso(0), "completionTime": iso(end_s), "succeeded": 1,
                       "failed": failed,
                       "conditions": [{"type": "Complete", "status": "True",
                                       "lastTransitionTime": iso(end_s)}]}}


def pod(phase: str, started_s: float, *, last_started_s: float | None = None,
        restarts: int = 0, reason: str | None = None,
        disruption: str | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {
        "phase": phase, "startTime": iso(started_s),
        "containerStatuses": [{
            "restartCount": restarts,
            "state": {"terminated": {"startedAt": iso(started_s)}},
            **({"lastState": {"terminated": {"startedAt": iso(last_started_s)}}}
               if last_started_s is not None else {})}]}
    if reason:
        status["reason"] = reason
    if disruption:
        status["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                 "reason": disruption}]
    return {"status": status}


def test_an_uninterrupted_run_is_timed_from_its_start_and_calibrates() -> None:
    outcome = tracking.job_outcome(job(end_s=1000), [pod("Succeeded", 100)])
    assert outcome is not None and outcome.measures_training
    assert outcome.training_seconds == 900 == outcome.actual.seconds


def test_a_preempted_run_counts_only_its_last_attempt_and_is_excluded() -> None:
    """The issue's case: preempted at 3x, the wall clock says 3x, the last attempt 1x."""
    pods = [pod("Failed", 100, disruption="PreemptionByScheduler"), pod("Succeeded", 2100)]
    outcome = tracking.job_outcome(job(end_s=3000), pods)
    assert outcome is not None
    assert outcome.actual.seconds == 2900 and outcome.training_seconds == 900
    assert outcome.interruptions == ("preempted",)
    assert not outcome.measures_training


@pytest.mark.parametrize(("pods", "failed", "observed_s", "labels"), [
    ([pod("Succeeded", 600, last_started_s=100, restarts=1)], 0, None, ("restarted",)),
    ([pod("Succeeded", 600)], 1, None, ("retried",)),
    ([pod("Failed", 100, reason="Evicted"), pod("Succeeded", 600)], 0, None, ("preempted",)),
    # Suspended and resumed by a queue: the first attempt's pods are gone, but the operator
    # noted their container start while they ran.
    ([pod("Succeeded", 600)], 0, 100, ("requeued",)),
    ([pod("Succeeded", 102)], 0, 100, ()),  # pods of one attempt start seconds apart
])
def test_interruptions_are_labelled(pods: list[dict[str, Any]], failed: int,
                                    observed_s: float | None, labels: tuple[str, ...]) -> None:
    observed = None if observed_s is None else T0 + datetime.timedelta(seconds=observed_s)
    outcome = tracking.job_outcome(job(end_s=1000, failed=failed), pods,
                                   observed_start=observed)
    assert outcome is not None and outcome.interruptions == labels
    # An interrupted run is timed from its last attempt's start; one attempt from the run's
    # first container start (noted while it ran: startedAt may be rewritten at termination).
    assert outcome.training_seconds == 400 if pods[-1]["status"]["startTime"] == iso(600) \
        else outcome.training_seconds == 900
