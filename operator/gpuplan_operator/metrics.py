"""Prometheus collectors of the operator; the registry is injected (tests pass their own)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from gpuplan_operator import benchmarks

# Drift is a ratio around 1: buckets are symmetric in log scale.
DRIFT_BUCKETS = (0.25, 0.5, 0.67, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5, 2.0, 4.0)


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
            "gpuplan_drift_ratio", "actual / estimated training time of finished jobs",
            ["gpu_type"], buckets=DRIFT_BUCKETS, registry=registry)
        self.estimator_requests = Counter(
            "gpuplan_estimator_requests", "Plan requests to the estimator by outcome",
            ["outcome"], registry=registry)

        self.benchmark_age_seconds = Gauge(
            "gpuplan_benchmark_age_seconds",
            "Age of the newest finished benchmark run per cluster GPU type (absent without one)",
            ["gpu_type"], registry=registry)
        self.gpu_type_measurements = Gauge(
            "gpuplan_gpu_type_measurements",
            "Measurement rows in the performance database per cluster GPU type (0 = no data)",
            ["gpu_type"], registry=registry)

    def observe_coverage(self, coverage: Iterable[benchmarks.GpuTypeCoverage]) -> None:
        """Replace both gauges: a GPU type that left the cluster must stop alerting."""
        self.benchmark_age_seconds.clear()
        self.gpu_type_measurements.clear()
        for c in coverage:
            self.gpu_type_measurements.labels(c.gpu_type).set(c.measurements)
            if c.age_seconds is not None:
                self.benchmark_age_seconds.labels(c.gpu_type).set(c.age_seconds)

    def observe_plan(self, namespace: str, name: str, gpu_type: str, seconds: float) -> None:
        """Record the estimated seconds of a new plan."""
        self.estimate_seconds.labels(namespace, name, gpu_type).set(seconds)

    def observe_finished(self, namespace: str, name: str, gpu_type: str, actual_seconds: float,
                         drift: float | None) -> None:
        """Record a finished job's measured seconds and, when known, its drift ratio."""
        self.actual_seconds.labels(namespace, name, gpu_type).set(actual_seconds)
        if drift is not None:
            self.drift_ratio.labels(gpu_type).observe(drift)

    def count_request(self, outcome: str) -> None:
        """Count one plan request to the estimator by its outcome."""
        self.estimator_requests.labels(outcome).inc()


def serve(registry: CollectorRegistry, port: int, addr: str = "0.0.0.0") -> Any:
    """Expose /metrics on `port` in a daemon thread; returns the server (None when port is 0)."""
    if not port:
        return None
    server, _thread = prometheus_client.start_http_server(port, addr=addr, registry=registry)
    return server
