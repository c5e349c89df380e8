"""Per-job gauges come and go with their TrainingJob; drift statistics count successes only."""

from __future__ import annotations

import datetime
import math

import pytest
from prometheus_client import CollectorRegistry

from gpuplan_operator import metrics

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
JOB = {"namespace": "ns", "trainingjob": "tj", "gpu_type": "NVIDIA-L4"}


def _gauges(registry: CollectorRegistry) -> tuple[float | None, float | None]:
    return (registry.get_sample_value("gpuplan_estimate_seconds", JOB),
            registry.get_sample_value("gpuplan_actual_seconds", JOB))


def test_gauges_of_a_deleted_trainingjob_are_removed() -> None:
    registry = CollectorRegistry()
    m = metrics.OperatorMetrics(registry)
    m.observe_plan("ns", "tj", "NVIDIA-L4", 100)
    m.observe_finished("ns", "tj", "NVIDIA-L4", 120, 1.2, succeeded=True, now=T0)
    assert _gauges(registry) == (100, 120)
    m.forget("ns", "tj")
    assert _gauges(registry) == (None, None)
    m.forget("ns", "tj")  # a second delete event is harmless


def test_gauges_of_finished_jobs_expire_after_the_retention() -> None:
    registry = CollectorRegistry()
    m = metrics.OperatorMetrics(registry)
    m.observe_plan("ns", "tj", "NVIDIA-L4", 100)
    m.observe_plan("ns", "running", "NVIDIA-L4", 100)
    m.observe_finished("ns", "tj", "NVIDIA-L4", 120, 1.2, succeeded=True, now=T0)
    assert m.expire(T0 + datetime.timedelta(seconds=3600), 3600) == []
    assert m.expire(T0 + datetime.timedelta(seconds=3601), 3600) == [("ns", "tj")]
    assert _gauges(registry) == (None, None)
    running = {**JOB, "trainingjob": "running"}
    assert registry.get_sample_value("gpuplan_estimate_seconds", running) == 100


def test_a_re_plan_on_another_gpu_type_replaces_the_label_set() -> None:
    registry = CollectorRegistry()
    m = metrics.OperatorMetrics(registry)
    m.observe_plan("ns", "tj", "NVIDIA-L4", 100)
    m.observe_plan("ns", "tj", "NVIDIA-H100-80GB-HBM3", 50)
    assert registry.get_sample_value("gpuplan_estimate_seconds", JOB) is None


def test_drift_is_averaged_in_log_space_and_failures_are_left_out() -> None:
    registry = CollectorRegistry()
    m = metrics.OperatorMetrics(registry)
    for name, drift in (("slow", 2.0), ("fast", 0.5)):
        m.observe_finished("ns", name, "NVIDIA-L4", 100, drift, succeeded=True, now=T0)
    m.observe_finished("ns", "crashed", "NVIDIA-L4", 5, 0.05, succeeded=False, now=T0)
    m.observe_finished("ns", "slower", "NVIDIA-L4", 100, 4.0, succeeded=True, now=T0)
    labels = {"gpu_type": "NVIDIA-L4", "trainingjob_namespace": "ns"}
    count = registry.get_sample_value("gpuplan_drift_ratio_count", labels)
    slow = registry.get_sample_value("gpuplan_drift_log_slow_total", labels)
    fast = registry.get_sample_value("gpuplan_drift_log_fast_total", labels)
    assert count == 3 and slow is not None and fast is not None
    assert (slow, fast) == (pytest.approx(math.log(8)), pytest.approx(math.log(2)))
    # 2x slow, 2x fast and 4x slow: the geometric mean is 4^(1/3); the arithmetic one, 2.17.
    assert math.exp((slow - fast) / count) == pytest.approx(4 ** (1 / 3))


def test_plan_outcomes_the_alerts_read_exist_from_zero() -> None:
    """GpuplanNoFeasiblePlans takes increase() of these: a series born at 1 would hide the
    first NoFeasiblePlan answers."""
    from gpuplan_operator.core.resources import Reason

    registry = CollectorRegistry()
    m = metrics.OperatorMetrics(registry)
    for outcome in ("ok", "NoFeasiblePlan"):
        assert registry.get_sample_value("gpuplan_estimator_requests_total",
                                         {"outcome": outcome}) == 0
    m.count_request(Reason.NO_FEASIBLE_PLAN)
    assert registry.get_sample_value("gpuplan_estimator_requests_total",
                                     {"outcome": "NoFeasiblePlan"}) == 1
