"""Prometheus metrics of the estimator service."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    """Prometheus metrics of the service, in `registry`."""
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            # The operator exports gpuplan_estimator_requests_total (its calls, by outcome).
            "gpuplan_estimator_http_requests_total", "Estimator HTTP requests served",
            ["endpoint", "code"], registry=registry,
        )
        self.latency = Histogram(
            "gpuplan_estimator_request_seconds", "Estimator request latency",
            ["endpoint"], registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )
        self.answers = Counter(
            "gpuplan_estimator_answers_total",
            "Plan and estimate answers by where they came from (computed, cache, shared)",
            ["source"], registry=registry,
        )
        self.worker_timeouts = Counter(
            "gpuplan_estimator_worker_timeouts_total",
            "Estimates stopped at their deadline (their worker process was killed)",
            registry=registry,
        )
        self.refit_failures = Counter(
            "gpuplan_estimator_calibration_refit_failures_total",
            "Calibration refits from job outcomes that failed (the last good one is kept)",
            registry=registry,
        )
        self.calibration_stale = Gauge(
            "gpuplan_estimator_calibration_stale",
            "1 while the last calibration refit failed and an older calibration is served "
            "(read from the service state at scrape time)",
            registry=registry,
        )
        self.calibration_outcomes = Gauge(
            "gpuplan_estimator_calibration_outcomes",
            "Job outcomes the calibration in use was fitted from", registry=registry,
        )
        self.scaling_refit_failures = Counter(
            "gpuplan_estimator_scaling_refit_failures_total",
            "Scaling-model refits from job outcomes that failed (the last good one is kept)",
            registry=registry,
        )
        self.scaling_stale = Gauge(
            "gpuplan_estimator_scaling_stale",
            "1 while the last scaling refit failed and an older scaling model is served",
            registry=registry,
        )
        self.scaling_samples = Gauge(
            "gpuplan_estimator_scaling_samples",
            "Multi-GPU job outcomes with scaling fields available to the scaling model in use",
            registry=registry,
        )
        self.scaling_fitted = Gauge(
            "gpuplan_estimator_scaling_fitted",
            "1 when plans use the scaling model fitted from outcomes, 0 for the analytic one",
            registry=registry,
        )
