"""Benchmark coverage: which GPU types get a Job, the Job itself, gauges, and one full pass."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import pathlib
import string
from collections.abc import Mapping
from typing import Any

import pandas as pd
import prometheus_client
import pytest
import yaml

from gpuplan_estimator import devices
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service, work
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import planner
from gpuplan_operator import benchmark_loop, estimator_client, metrics
from gpuplan_operator.core import benchmarks, errors
from gpuplan_operator.core import settings as operator_settings
from gpuplan_testing.operator_builders import LocalServer

NOW = dt.datetime(2026, 6, 15, 8, 30, tzinfo=dt.UTC)
DAY = 86400.0
KNOWN = {"NVIDIA-L4": "l4", "NVIDIA-H100-80GB-HBM3": "h100-sxm-80gb", "Tesla-T4": "t4"}
Cov = benchmarks.CoveredDevice
A = benchmarks.Action
OPTIONS = benchmarks.BenchmarkJobOptions(image="img:1", db_secret="perfdb", budget_minutes=60)


def _resolve(gpu_type: str) -> str | None:
    return KNOWN.get(gpu_type)


@pytest.mark.parametrize(("coverage", "running", "action", "rows", "age"), [
    ({}, (), A.MISSING, 0, None),
    # The served bundle covers the type: no benchmark Job, no "without data" (issue #17).
    ({"l4": Cov(0, None, True)}, (), A.BUNDLED, 0, None),
    ({"l4": Cov(12, NOW.timestamp() - 31 * DAY, True)}, (), A.BUNDLED, 12, 31 * DAY),
    # Per-GPU bundle rows, when the estimator reports them, decide over `in_bundle`.
    ({"l4": Cov(0, None, False, bundle_rows=480)}, (), A.BUNDLED, 0, None),
    ({"l4": Cov(0, None, True, bundle_rows=0)}, (), A.MISSING, 0, None),
    ({"l4": Cov(12, NOW.timestamp() - 31 * DAY, True, bundle_rows=0)}, (), A.STALE, 12, 31 * DAY),
    ({"l4": Cov(12, NOW.timestamp() - 2 * DAY, True)}, (), A.OK, 12, 2 * DAY),
    ({"l4": Cov(0, None, True)}, ("NVIDIA-L4",), A.RUNNING, 0, None),
    ({"l4": Cov(0, NOW.timestamp() - DAY, False)}, (), A.MISSING, 0, DAY),
    ({"l4": Cov(12, None, False)}, (), A.MISSING, 12, None),  # rows, but no finished run
    ({"l4": Cov(12, NOW.timestamp() - 2 * DAY, False)}, (), A.OK, 12, 2 * DAY),
    ({"l4": Cov(12, NOW.timestamp() - 31 * DAY, False)}, (), A.STALE, 12, 31 * DAY),
    ({}, ("NVIDIA-L4",), A.RUNNING, 0, None),
    ({"l4": Cov(3, NOW.timestamp() + 60, False)}, (), A.OK, 3, 0.0),  # clock skew: age 0
])
def test_assess_one_known_type(coverage: Mapping[str, benchmarks.CoveredDevice],
                               running: tuple[str, ...], action: str, rows: int,
                               age: float | None) -> None:
    [got] = benchmarks.assess(["NVIDIA-L4"], coverage, _resolve, now_unix=NOW.timestamp(),
                              max_age_seconds=30 * DAY, running=running)
    assert (got.gpu_type, got.device, got.action, got.measurements) == (
        "NVIDIA-L4", "l4", action, rows)
    assert got.age_seconds == age
    assert got.needs_benchmark == (action in {A.MISSING, A.STALE})
    cov = coverage.get("l4")
    assert got.in_bundle == (cov is not None and (
        cov.bundle_rows > 0 if cov.bundle_rows is not None else cov.in_bundle))


def test_assess_dedupes_sorts_and_flags_unknown_types() -> None:
    got = benchmarks.assess(["NVIDIA-L4", "Mystery-GPU", "NVIDIA-L4", "Tesla-T4"],
                            {"t4": Cov(5, NOW.timestamp(), True)}, _resolve,
                            now_unix=NOW.timestamp(), max_age_seconds=DAY)
    assert [(c.gpu_type, c.action) for c in got] == [
        ("Mystery-GPU", A.UNKNOWN), ("NVIDIA-L4", A.MISSING), ("Tesla-T4", A.OK)]
    assert not got[0].needs_benchmark and got[0].measurements == 0


def test_catalog_resolver_maps_gfd_labels_and_returns_none_for_unknown() -> None:
    resolve = benchmarks.catalog_resolver(devices.load_catalog())
    assert resolve("NVIDIA-L4") == "l4"
    assert resolve("NVIDIA-A100-SXM4-80GB") == "a100-sxm4-80gb"
    assert resolve("Quantum-Abacus-9000") is None


@pytest.mark.parametrize(("gpu_type", "name"), [
    ("NVIDIA-L4", "gpuplan-bench-nvidia-l4-20260615"),
    ("NVIDIA-H100-80GB-HBM3", "gpuplan-bench-nvidia-h100-80gb-hbm3-20260615"),
    ("NVIDIA_A100.SXM4--80GB", "gpuplan-bench-nvidia-a100-sxm4-80gb-20260615"),
])
def test_job_name_is_a_dns_label_per_type_and_day(gpu_type: str, name: str) -> None:
    assert benchmarks.job_name(gpu_type, NOW.date()) == name


def test_long_types_keep_distinct_names_within_63_characters() -> None:
    a = benchmarks.job_name("NVIDIA-Some-Very-Long-Product-Name-With-Many-Parts-A", NOW.date())
    b = benchmarks.job_name("NVIDIA-Some-Very-Long-Product-Name-With-Many-Parts-B", NOW.date())
    assert a != b and len(a) <= 63 and len(b) <= 63
    assert settings_dns_label(a) and settings_dns_label(b)


def settings_dns_label(name: str) -> bool:
    return operator_settings.DNS_LABEL.match(name) is not None


def test_build_job_pins_one_gpu_of_the_type_and_reads_the_db_secret() -> None:
    job = benchmarks.build_job("NVIDIA-L4", now=NOW, namespace="gpuplan", options=OPTIONS)
    assert job["metadata"]["name"] == "gpuplan-bench-nvidia-l4-20260615"
    assert job["metadata"]["namespace"] == "gpuplan"
    assert job["metadata"]["labels"][benchmarks.PRODUCT_LABEL] == "NVIDIA-L4"
    assert job["metadata"]["labels"][benchmarks.COMPONENT_LABEL] == "benchmark"
    assert "gpuplan.io/trainingjob" not in job["metadata"]["labels"]  # not a training Job
    spec = job["spec"]
    assert spec["activeDeadlineSeconds"] == 60 * 60 + benchmarks.DEADLINE_MARGIN_SECONDS
    assert spec["ttlSecondsAfterFinished"] == 86400 and spec["backoffLimit"] == 2
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert pod["restartPolicy"] == "Never"
    [c] = pod["containers"]
    assert c["image"] == "img:1" and c["resources"]["limits"] == {"nvidia.com/gpu": 1}
    assert c["args"] == ["bench", "--device", "cuda", "--backend", "torch",
                         "--budget-minutes", "60", "--sweep", "/sweeps"]
    assert c["env"][0] == {"name": "GPUPLAN_DB_URL",
                           "valueFrom": {"secretKeyRef": {"name": "perfdb", "key": "url"}}}


def _job(product: str, *conditions: str) -> dict[str, Any]:
    return {"metadata": {"labels": {benchmarks.PRODUCT_LABEL: product}},
            "status": {"conditions": [{"type": t, "status": "True"} for t in conditions]}}


def test_running_gpu_types_ignores_finished_jobs() -> None:
    jobs = [_job("NVIDIA-L4"), _job("Tesla-T4", "Complete"), _job("NVIDIA-H100", "Failed"),
            {"metadata": {"labels": {}}}]
    assert benchmarks.running_gpu_types(jobs) == {"NVIDIA-L4"}


ENABLED = {"GPUPLAN_ESTIMATOR_URL": "http://est:8080", "GPUPLAN_BENCHMARKS_ENABLED": "true",
           "GPUPLAN_BENCHMARK_MAX_AGE_DAYS": "7", "GPUPLAN_BENCHMARK_IMAGE": "reg/bench:1",
           "GPUPLAN_BENCHMARK_DB_SECRET": "gpuplan-perfdb", "GPUPLAN_BENCHMARK_NAMESPACE": "ml",
           "GPUPLAN_BENCHMARK_INTERVAL_SECONDS": "5"}


def test_benchmark_settings_from_env() -> None:
    s = operator_settings.Settings.from_env(ENABLED).validate()
    assert s.benchmarks_enabled and s.benchmark_max_age_days == 7
    assert (s.benchmark_image, s.benchmark_db_secret, s.benchmark_namespace) == (
        "reg/bench:1", "gpuplan-perfdb", "ml")
    assert s.benchmark_interval_seconds == 5


def test_enabled_benchmarks_need_image_secret_and_namespace() -> None:
    s = operator_settings.Settings(estimator_url="http://e:1", benchmarks_enabled=True,
                                   benchmark_namespace="Bad_NS", benchmark_max_age_days=0)
    with pytest.raises(errors.SettingsError) as info:
        s.validate()
    for field in ("benchmark_image", "benchmark_db_secret", "benchmark_namespace",
                  "benchmark_max_age_days"):
        assert field in str(info.value)
    # Disabled, the Job fields may stay empty.
    operator_settings.Settings(estimator_url="http://e:1").validate()


def test_parse_coverage_names_the_bad_device() -> None:
    got = estimator_client.parse_coverage({"devices": {
        "l4": {"measurements": 3, "newest_run_unix": 1.5e9, "in_bundle": False},
        "t4": {"measurements": 0, "newest_run_unix": None, "in_bundle": True}}})
    assert got == {"l4": Cov(3, 1.5e9, False), "t4": Cov(0, None, True)}
    with pytest.raises(errors.EstimatorProtocolError, match=r"devices\.t4"):
        estimator_client.parse_coverage({"devices": {"t4": {"measurements": 1}}})
    with pytest.raises(errors.EstimatorProtocolError, match="devices"):
        estimator_client.parse_coverage({"nodes": {}})


def test_gauges_follow_the_latest_assessment() -> None:
    registry = prometheus_client.CollectorRegistry()
    m = metrics.OperatorMetrics(registry)
    first = benchmarks.assess(["NVIDIA-L4", "Tesla-T4"], {"t4": Cov(9, NOW.timestamp() - 100,
                                                                     True)},
                              _resolve, now_unix=NOW.timestamp(), max_age_seconds=DAY)
    m.observe_coverage(first)
    text = prometheus_client.generate_latest(registry).decode()
    assert 'gpuplan_gpu_type_measurements{gpu_type="NVIDIA-L4"} 0.0' in text
    assert 'gpuplan_gpu_type_measurements{gpu_type="Tesla-T4"} 9.0' in text
    assert 'gpuplan_benchmark_age_seconds{gpu_type="Tesla-T4"} 100.0' in text
    assert 'gpuplan_benchmark_age_seconds{gpu_type="NVIDIA-L4"}' not in text
    assert 'gpuplan_gpu_type_in_bundle{gpu_type="Tesla-T4"} 1.0' in text
    assert 'gpuplan_gpu_type_in_bundle{gpu_type="NVIDIA-L4"} 0.0' in text
    # Job counters exist at 0 for every type seen, so increase() sees the first failure.
    assert 'gpuplan_benchmark_jobs_total{gpu_type="NVIDIA-L4",outcome="failed"} 0.0' in text
    m.observe_coverage(first[1:])  # the L4 nodes left the cluster
    gauges = [line for line in prometheus_client.generate_latest(registry).decode().splitlines()
              if 'gpu_type="NVIDIA-L4"' in line]
    assert gauges and all(line.startswith("gpuplan_benchmark_jobs_") for line in gauges)


class FakeKube:
    """Stands in for `kube.Kube` (the only API caller); records Jobs it is asked to create."""

    def __init__(self, nodes: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> None:
        self.nodes, self.jobs, self.created = nodes, jobs, []  # type: ignore[var-annotated]

    async def list_gpu_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    async def list_jobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        assert label_selector == "app.kubernetes.io/component=benchmark"
        return self.jobs

    async def create_job(self, namespace: str, body: Mapping[str, Any]
                         ) -> tuple[dict[str, Any], bool]:
        self.created.append((namespace, dict(body)))
        return dict(body), True


def _node(name: str, product: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": product}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def _frame(device: str) -> pd.DataFrame:
    return pd.DataFrame({
        "device": device, "backend": "b", "kernel": "gemm", "op": "matmul", "dtype": "float32",
        "dims": ['{"m":1}'], "latency_ms": [1.0], "latency_std_ms": [0.0], "repeats": 3,
        "source": "t"})


def test_refresh_against_the_real_service_and_sqlite(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    with PerfStore.open(url, clock=lambda: NOW - dt.timedelta(days=1)) as store:
        run = store.add_run(device="t4", backend="b")
        store.add_measurements(run, _frame("t4"))
        store.finish_run(run, "done")
    context = planner.PlannerContext(catalog=devices.load_catalog(),
                                   predictor=roofline.RooflinePredictor(),
                                   predictor_source="roofline")
    app = service.make_app(service.ServiceState(functools.partial(work.given_context, context)),
                           service.ServiceSettings(bundle_poll_s=3600),
                           coverage_source=serving.perfdb_coverage_source(url))
    kube = FakeKube([_node("l4-0", "NVIDIA-L4"), _node("t4-0", "Tesla-T4"),
                     _node("h-0", "NVIDIA-H100-80GB-HBM3")], [_job("NVIDIA-H100-80GB-HBM3")])
    registry = prometheus_client.CollectorRegistry()

    async def run_pass(estimator_url: str) -> list[benchmarks.GpuTypeCoverage]:
        cfg = operator_settings.Settings.from_env(
            {**ENABLED, "GPUPLAN_ESTIMATOR_URL": estimator_url}).validate()
        ctx = benchmark_loop.LoopContext(
            kube=kube, settings=cfg, metrics=metrics.OperatorMetrics(registry),  # type: ignore[arg-type]
            clock=lambda: NOW, resolve=benchmarks.catalog_resolver(devices.load_catalog()))
        return await benchmark_loop.refresh(ctx)

    async def main() -> list[benchmarks.GpuTypeCoverage]:
        async with LocalServer(app) as srv:
            return await run_pass(srv.url)

    got = asyncio.run(main())
    assert [(c.gpu_type, c.action) for c in got] == [
        ("NVIDIA-H100-80GB-HBM3", A.RUNNING), ("NVIDIA-L4", A.MISSING), ("Tesla-T4", A.OK)]
    assert [(ns, b["metadata"]["name"]) for ns, b in kube.created] == [
        ("ml", "gpuplan-bench-nvidia-l4-20260615")]
    text = prometheus_client.generate_latest(registry).decode()
    assert 'gpuplan_gpu_type_measurements{gpu_type="NVIDIA-L4"} 0.0' in text
    assert 'gpuplan_benchmark_age_seconds{gpu_type="Tesla-T4"} 86400.0' in text


def test_refresh_with_the_estimator_down_is_unavailable() -> None:
    cfg = operator_settings.Settings.from_env(
        {**ENABLED, "GPUPLAN_ESTIMATOR_URL": "http://127.0.0.1:9",
         "GPUPLAN_ESTIMATOR_TIMEOUT_SECONDS": "1"}).validate()
    ctx = benchmark_loop.LoopContext(
        kube=FakeKube([_node("l4-0", "NVIDIA-L4")], []), settings=cfg,  # type: ignore[arg-type]
        metrics=metrics.OperatorMetrics(prometheus_client.CollectorRegistry()),
        clock=lambda: NOW, resolve=_resolve)
    with pytest.raises(errors.EstimatorUnavailableError, match="/v1/coverage"):
        asyncio.run(benchmark_loop.refresh(ctx))


def test_built_job_matches_the_documented_template() -> None:
    root = pathlib.Path(__file__).resolve().parents[3]
    text = (root / "benchmark-jobs" / "job-template.yaml").read_text()
    template = yaml.safe_load(string.Template(text).substitute(
        NAME="n", NAMESPACE="gpuplan", GPU_PRODUCT="NVIDIA-L4", IMAGE="img:1",
        DB_SECRET="perfdb", BUDGET_MINUTES="60", BACKEND="torch"))
    built = benchmarks.build_job("NVIDIA-L4", now=NOW, namespace="gpuplan", options=OPTIONS)
    assert template["metadata"]["labels"].items() <= built["metadata"]["labels"].items()
    t_pod, b_pod = template["spec"]["template"]["spec"], built["spec"]["template"]["spec"]
    for key in ("restartPolicy", "nodeSelector", "securityContext", "volumes"):
        assert b_pod[key] == t_pod[key], key
    t_c, b_c = t_pod["containers"][0], b_pod["containers"][0]
    for key in ("image", "args", "env", "resources", "securityContext", "volumeMounts"):
        assert b_c[key] == t_c[key], key
    for key in ("backoffLimit", "podFailurePolicy"):
        assert built["spec"][key] == template["spec"][key], key
