"""Retraining as a Job (issue #17): triggers, one Job at a time, the Job's pod, its outcome,
and the metric that counts it."""

from __future__ import annotations

import datetime
from typing import Any

import prometheus_client
import pytest

from gpuplan_operator import metrics
from gpuplan_operator.core import benchmarks, retraining

OPTIONS = retraining.RetrainJobOptions(image="ghcr.io/gpuplan/gpuplan:0.1.0", db_secret="perfdb",
                                max_rows=40000, resources={"requests": {"cpu": "2"}})


def _job(**status: Any) -> dict[str, Any]:
    return {"metadata": {"uid": "u1", "name": "j"}, "status": status}


def test_only_a_succeeded_benchmark_with_new_rows_triggers() -> None:
    done = [benchmarks.FinishedJob("a", "NVIDIA-L4", benchmarks.BenchmarkOutcome.SUCCEEDED),
            benchmarks.FinishedJob("b", "Tesla-T4", benchmarks.BenchmarkOutcome.SUCCEEDED),
            benchmarks.FinishedJob("c", "NVIDIA-L4", benchmarks.BenchmarkOutcome.FAILED)]
    got = retraining.benchmark_triggers(done, {"NVIDIA-L4": True, "Tesla-T4": False},
                                        last_training_unix=None)
    assert got == [retraining.Trigger("benchmark", "a")]


def test_a_benchmark_that_ended_before_the_newest_training_started_was_read() -> None:
    ok = benchmarks.BenchmarkOutcome.SUCCEEDED
    done = [benchmarks.FinishedJob("late", "NVIDIA-L4", ok, 2000.0),
            benchmarks.FinishedJob("early", "NVIDIA-L4", ok, 500.0),
            benchmarks.FinishedJob("before", "NVIDIA-L4", ok, 900.0)]
    got = retraining.benchmark_triggers(done, {"NVIDIA-L4": True}, last_training_unix=1000.0)
    assert got == [retraining.Trigger("benchmark", "late")]
    # With no training Job ever, all of them, oldest first (the newest starts the Job).
    assert [t.key for t in retraining.benchmark_triggers(
        done, {"NVIDIA-L4": True}, last_training_unix=None)] == ["early", "before", "late"]


def test_job_times_come_from_the_api_objects() -> None:
    job = {"metadata": {"uid": "u", "creationTimestamp": "2026-06-15T08:00:00Z",
                        "labels": {benchmarks.PRODUCT_LABEL: "NVIDIA-L4"}},
           "status": {"conditions": [{"type": "Complete", "status": "True",
                                      "lastTransitionTime": "2026-06-15T08:10:00Z"}]}}
    [finished] = benchmarks.finished_jobs([job])
    assert finished.finished_unix == benchmarks.created_unix(job) + 600
    job["status"]["completionTime"] = "2026-06-15T08:09:00Z"
    assert benchmarks.finished_unix(job) == benchmarks.created_unix(job) + 540
    assert retraining.last_start_unix([job, {"metadata": {}}]) == benchmarks.created_unix(job)
    assert retraining.last_start_unix([]) is None


def test_the_schedule_is_off_by_default_and_one_slot_per_interval() -> None:
    assert retraining.schedule_trigger(1e9, 0) is None
    first = retraining.schedule_trigger(86400 * 10 + 5, 86400)
    assert first == retraining.schedule_trigger(86400 * 11 - 1, 86400)
    assert first != retraining.schedule_trigger(86400 * 11, 86400)


def test_one_job_at_a_time_and_the_newest_trigger_wins() -> None:
    a, b = retraining.Trigger("benchmark", "a"), retraining.Trigger("schedule", "7")
    assert retraining.next_trigger([a, b], running=True) is None
    assert retraining.next_trigger([a, b], running=False) == b
    assert retraining.next_trigger([], running=False) is None


def test_the_job_is_named_by_the_trigger_and_runs_non_root() -> None:
    trigger = retraining.Trigger("benchmark", "uid-1")
    job = retraining.build_job(trigger, namespace="gpuplan", options=OPTIONS)
    assert job["metadata"]["name"] == f"gpuplan-retrain-benchmark-{trigger.digest}"
    assert len(job["metadata"]["name"]) <= 63 and len(trigger.digest) == 12
    again = retraining.build_job(retraining.Trigger("benchmark", "uid-1"), namespace="gpuplan",
                                 options=OPTIONS)
    assert again == job  # a restarted operator gets 409, never a twin
    assert job["metadata"]["labels"][benchmarks.COMPONENT_LABEL] == "retraining"
    pod = job["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == ["train", "--db", "$(GPUPLAN_DB_URL)", "--candidate",
                                 "--promote", "--max-rows", "40000"]
    assert container["env"][0] == {"name": "GPUPLAN_DB_URL", "valueFrom": {
        "secretKeyRef": {"name": "perfdb", "key": "url"}}}
    bench = benchmarks.build_job("NVIDIA-L4", now=datetime.datetime(2026, 1, 1),
                                 namespace="gpuplan", options=benchmarks.BenchmarkJobOptions(
                                     image="i", db_secret="perfdb", budget_minutes=5))
    bench_pod = bench["spec"]["template"]["spec"]
    assert pod["securityContext"] == bench_pod["securityContext"]
    assert container["securityContext"] == bench_pod["containers"][0]["securityContext"]
    assert container["resources"] == {"requests": {"cpu": "2"}}
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert rules[1]["onExitCodes"]["values"] == [3]


@pytest.mark.parametrize(("conditions", "expected"), [
    ([], None),
    ([{"type": "Complete", "status": "True"}], "promoted"),
    ([{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
       "message": "Container train for pod ns/p failed with exit code 3 matching FailJob rule "
                  "at index 1"}], "refused"),
    ([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded",
       "message": "Job has reached the specified backoff limit"}], "failed"),
    ([{"type": "Failed", "status": "True", "reason": "PodFailurePolicy",
       "message": "Container train failed with exit code 4 matching FailJob rule"}], "failed"),
])
def test_the_exit_code_is_the_outcome(conditions: list[dict[str, Any]],
                                      expected: str | None) -> None:
    job = _job(conditions=conditions)
    assert retraining.outcome(job) == expected
    assert retraining.any_running([job]) is (expected is None)
    assert retraining.finished_jobs([job]) == ([] if expected is None else [("u1", expected)])


def test_outcomes_are_counted_from_zero() -> None:
    registry = prometheus_client.CollectorRegistry()
    m = metrics.OperatorMetrics(registry)
    assert registry.get_sample_value("gpuplan_retraining_jobs_total",
                                     {"outcome": "refused"}) == 0
    m.count_retraining_job(retraining.RetrainOutcome.REFUSED)
    assert registry.get_sample_value("gpuplan_retraining_jobs_total",
                                     {"outcome": "refused"}) == 1
