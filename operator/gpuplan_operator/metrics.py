"""Prometheus collectors of the operator; the registry is injected (tests pass their own)."""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuplan_operator.core import benchmarks, resources, retraining

# Drift is a ratio around 1: buckets are symmetric in log scale.
DRIFT_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)
# gpuplan_estimator_requests_total outcomes the alerts read: a plan, or the estimator's
# NoFeasiblePlan (no GPU type of the cluster fits the job); errors use their reason.
PLAN_OK = "ok"
PLAN_NO_FEASIBLE = resources.Reason.NO_FEASIBLE_PLAN


DRIFT_LABELS = ["gpu_type", "trainingjob_namespace"]
"""Drift is grouped by the TrainingJob's namespace too, so one tenant's slow jobs alert as that
tenant's (issue #33). Not `namespace`: Prometheus renames a target label it would overwrite."""


class OperatorMetrics:
    """The operator's Prometheus collectors, registered on `registry`."""

    def __init__(self, registry: CollectorRegistry = prometheus_client.REGISTRY) -> None:
        self.registry = registry
        self.estimate_seconds = Gauge(
            "gpuplan_estimate_seconds", "Estimated training seconds of the latest plan per job",
            ["namespace", "trainingjob", "gpu_type"], registry=registry)
        self.actual_seconds = Gauge(
            "gpuplan_actual_seconds", "Measured training seconds of a finished job",
            ["namespace", "trainingjob", "gpu_type"], registry=registry)
        self.drift_ratio = Histogram(
            "gpuplan_drift_ratio", "actual / estimated training time of succeeded jobs",
            DRIFT_LABELS, buckets=DRIFT_BUCKETS, registry=registry)
        # Ratios average geometrically: 2x slow and 2x fast should cancel to 1, not to 1.25. The
        # sum of ln(drift) is split by sign into two counters because rate() reads any decrease
        # of a counter as a restart; the alerts take
        # exp((rate(slow) - rate(fast)) / rate(gpuplan_drift_ratio_count)).
        self.drift_log_slow = Counter(
            "gpuplan_drift_log_slow",
            "Sum of ln(actual / estimated) over succeeded jobs that ran longer than estimated",
            DRIFT_LABELS, registry=registry)
        self.drift_log_fast = Counter(
            "gpuplan_drift_log_fast",
            "Sum of ln(estimated / actual) over succeeded jobs that ran shorter than estimated",
            DRIFT_LABELS, registry=registry)
        self.estimator_requests = Counter(
            "gpuplan_estimator_requests", "Plan requests to the estimator by outcome",
            ["outcome"], registry=registry)
        # From 0, so the GpuplanNoFeasiblePlans alert's increase() sees the first ones.
        for outcome in (PLAN_OK, PLAN_NO_FEASIBLE):
            self.estimator_requests.labels(outcome)

        self.benchmark_age_seconds = Gauge(
            "gpuplan_benchmark_age_seconds",
            "Age of the newest finished benchmark run per cluster GPU type (absent without one)",
            ["gpu_type"], registry=registry)
        self.gpu_type_measurements = Gauge(
            "gpuplan_gpu_type_measurements",
            "Measurement rows in the performance database per cluster GPU type (0 = no data)",
            ["gpu_type"], registry=registry)
        self.gpu_type_in_bundle = Gauge(
            "gpuplan_gpu_type_in_bundle",
            "1 when the served model bundle covers the cluster GPU type (estimates use learned "
            "models even without database rows), else 0",
            ["gpu_type"], registry=registry)
        self.benchmark_jobs = Counter(
            "gpuplan_benchmark_jobs",
            "Benchmark Jobs that finished, by GPU type and outcome (succeeded, failed, "
            "budget_spent: stopped by --budget-minutes, resumed by the next Job)",
            ["gpu_type", "outcome"], registry=registry)
        self.retraining_jobs = Counter(
            "gpuplan_retraining_jobs",
            "Training Jobs (gpuplan train --candidate --promote) that finished, by outcome "
            "(promoted, refused: the promotion gate kept the active bundle, failed)",
            ["outcome"], registry=registry)
        for outcome in retraining.RetrainOutcome.ALL:  # from 0, so increase() sees the first one
            self.retraining_jobs.labels(outcome)
        # Per-job label sets: (namespace, trainingjob) → (gpu_type, when it finished or None).
        self._jobs: dict[tuple[str, str], tuple[str, datetime.datetime | None]] = {}

    def observe_coverage(self, coverage: Iterable[benchmarks.GpuTypeCoverage]) -> None:
        """Replace both gauges: a GPU type that left the cluster must stop alerting."""
        self.benchmark_age_seconds.clear()
        self.gpu_type_measurements.clear()
        self.gpu_type_in_bundle.clear()
        for c in coverage:
            self.gpu_type_measurements.labels(c.gpu_type).set(c.measurements)
            self.gpu_type_in_bundle.labels(c.gpu_type).set(1 if c.in_bundle else 0)
            # Counters start at 0 for every type seen, so increase() sees a first failure.
            for outcome in benchmarks.BenchmarkOutcome.ALL:
                self.benchmark_jobs.labels(c.gpu_type, outcome)
            if c.age_seconds is not None:
                self.benchmark_age_seconds.labels(c.gpu_type).set(c.age_seconds)

    def count_benchmark_job(self, gpu_type: str, outcome: str) -> None:
        """Count one finished benchmark Job by its `benchmarks.BenchmarkOutcome`."""
        self.benchmark_jobs.labels(gpu_type, outcome).inc()

    def count_retraining_job(self, outcome: str) -> None:
        """Count one finished training Job by its `retraining.RetrainOutcome`."""
        self.retraining_jobs.labels(outcome).inc()

    def observe_plan(self, namespace: str, name: str, gpu_type: str, seconds: float) -> None:
        """Record the estimated seconds of a new plan (a re-plan replaces the old labels)."""
        self.forget(namespace, name)
        self.estimate_seconds.labels(namespace, name, gpu_type).set(seconds)
        self._jobs[namespace, name] = (gpu_type, None)

    def observe_finished(self, namespace: str, name: str, gpu_type: str, actual_seconds: float,
                         drift: float | None, *, succeeded: bool,
                         now: datetime.datetime) -> None:
        """Record a finished job's measured seconds and, for a success, its drift ratio.

        A failed run says nothing about the estimate (it stopped early or crashed), so it
        never enters the drift statistics.
        """
        self.actual_seconds.labels(namespace, name, gpu_type).set(actual_seconds)
        self._jobs[namespace, name] = (gpu_type, now)
        if succeeded and drift is not None and drift > 0:
            log_drift = math.log(drift)
            by = (gpu_type, namespace)
            self.drift_ratio.labels(*by).observe(drift)
            self.drift_log_slow.labels(*by).inc(max(log_drift, 0.0))
            self.drift_log_fast.labels(*by).inc(max(-log_drift, 0.0))

    def forget(self, namespace: str, name: str) -> None:
        """Drop the per-job gauges of a TrainingJob (deleted, re-planned or expired)."""
        known = self._jobs.pop((namespace, name), None)
        if known is None:
            return
        for gauge in (self.estimate_seconds, self.actual_seconds):
            gauge.remove(namespace, name, known[0])  # a label set it never had is ignored

    def expire(self, now: datetime.datetime, retention_seconds: float) -> list[tuple[str, str]]:
        """Drop the gauges of jobs that finished more than `retention_seconds` ago (they have
        been scraped by then); returns the (namespace, name) pairs dropped."""
        old = [key for key, (_gpu, finished) in self._jobs.items()
               if finished is not None and (now - finished).total_seconds() > retention_seconds]
        for namespace, name in old:
            self.forget(namespace, name)
        return old

    def count_request(self, outcome: str) -> None:
        """Count one plan request to the estimator by its outcome."""
        self.estimator_requests.labels(outcome).inc()


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> Any:
    """Expose /metrics on `port` in a daemon thread; returns the server (None when port is 0)."""
    if not port:
        return None
    server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    return server
