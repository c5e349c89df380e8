"""Per-job gauges come and go with their TrainingJob; drift statistics count successes only."""

from __future__ import annotations

import datetime
import math

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
    labels = {"gpu_type": "NVIDIA-L4"}
    count = registry.get_sample_value("gpuplan_drift_log_ratio_count", labels)
    total = registry.get_sample_value("gpuplan_drift_log_ratio_sum", labels)
    assert count == 2 and registry.get_sample_value("gpuplan_drift_ratio_count", labels) == 2
    assert total is not None
    # 2x slow and 2x fast: the geometric mean is 1 (the arithmetic one would say 1.25).
    assert math.exp(total / count) == 1.0
