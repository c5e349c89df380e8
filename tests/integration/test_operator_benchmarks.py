"""Benchmark coverage on the real control plane: an empty performance database makes the
operator create one benchmark Job per GPU type of the kwok nodes and export zero-row gauges."""

from __future__ import annotations

import time
import urllib.request
from typing import Any

import pytest

from gpuplan_testing import operator_harness as h
from gpuplan_testing.estimator_server import EstimatorServer

pytestmark = pytest.mark.slow
# testbed/nodes.yaml: the GPU pools of the kwok nodes.
KWOK_GPU_TYPES = {"NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"}


def _bench_jobs(batch_v1: Any, namespace: str) -> list[Any]:
    return list(batch_v1.list_namespaced_job(
        namespace, label_selector="app.kubernetes.io/component=benchmark",
        _request_timeout=30).items)


def test_empty_perf_db_gets_one_benchmark_job_per_gpu_type(
        monkeypatch: pytest.MonkeyPatch, namespace: str, testbed: Any, batch_v1: Any,
        estimator: EstimatorServer, wait_for: Any) -> None:
    port = h.free_port()
    env = {"METRICS_PORT": str(port), "BENCHMARKS_ENABLED": "true",
           "BENCHMARK_IMAGE": "gpuplan-bench:test", "BENCHMARK_DB_SECRET": "gpuplan-perfdb",
           "BENCHMARK_NAMESPACE": namespace, "BENCHMARK_INTERVAL_SECONDS": "1"}
    with h.run_operator(monkeypatch, namespace, estimator.url, **env):
        wait_for(lambda: len(_bench_jobs(batch_v1, namespace)) >= len(KWOK_GPU_TYPES), 60,
                 "one benchmark Job per GPU type")
        metrics = wait_for(lambda: _scrape_if(port, "gpuplan_gpu_type_measurements{"), 30,
                           "coverage gauges")
        # Later passes (1 s apart) find the Jobs unfinished: never a second one per type.
        time.sleep(3)
        # Only the testbed's own pools: another session's test may add a node of its own.
        jobs = [j for j in _bench_jobs(batch_v1, namespace)
                if j.metadata.labels["gpuplan.io/gpu-product"] in KWOK_GPU_TYPES]
    products = [j.metadata.labels["gpuplan.io/gpu-product"] for j in jobs]
    assert sorted(products) == sorted(KWOK_GPU_TYPES)
    for job in jobs:
        product = job.metadata.labels["gpuplan.io/gpu-product"]
        assert job.metadata.name.startswith("gpuplan-bench-nvidia-")
        pod = job.spec.template.spec
        assert pod.node_selector == {"nvidia.com/gpu.product": product}
        assert pod.containers[0].resources.limits == {"nvidia.com/gpu": "1"}
        assert pod.containers[0].env[0].value_from.secret_key_ref.name == "gpuplan-perfdb"
        assert job.spec.active_deadline_seconds and job.spec.ttl_seconds_after_finished
    for product in sorted(KWOK_GPU_TYPES):
        assert f'gpuplan_gpu_type_measurements{{gpu_type="{product}"}} 0.0' in metrics
    assert "gpuplan_benchmark_age_seconds{" not in metrics  # no finished run anywhere


def _scrape_if(port: int, needle: str) -> str:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return text if needle in text else ""
