"""Benchmark Jobs that run where GPUs are (issue #17): the pod spec from settings, the outcome
of a finished Job on a counter, and coverage that counts the served bundle."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
import json
from collections.abc import Mapping
from typing import Any

import prometheus_client
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.interfaces.http import service, work
from gpuplan_estimator.planning import planner
from gpuplan_operator import benchmark_loop, estimator_client, metrics
from gpuplan_operator.core import benchmarks, errors
from gpuplan_operator.core import settings as operator_settings
from gpuplan_testing.operator_builders import LocalServer

NOW = dt.datetime(2026, 6, 15, 8, 30, tzinfo=dt.UTC)
Outcome = benchmarks.BenchmarkOutcome
TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
ENV = {"GPUPLAN_ESTIMATOR_URL": "http://est:8080", "GPUPLAN_BENCHMARKS_ENABLED": "true",
       "GPUPLAN_BENCHMARK_IMAGE": "reg/bench:1", "GPUPLAN_BENCHMARK_DB_SECRET": "perfdb",
       "GPUPLAN_BENCHMARK_NAMESPACE": "ml", "GPUPLAN_BENCHMARK_BUDGET_MINUTES": "45",
       "GPUPLAN_BENCHMARK_PRIORITY_CLASS_NAME": "batch-low",
       "GPUPLAN_BENCHMARK_TOLERATIONS_JSON": json.dumps([TAINT]),
       "GPUPLAN_BENCHMARK_NODE_SELECTOR_JSON": json.dumps({"pool": "gpu",
                                                           "nvidia.com/gpu.product": "X"}),
       "GPUPLAN_BENCHMARK_RESOURCES_JSON": json.dumps(
           {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"memory": "32Gi"}})}


def _settings(**env: str) -> operator_settings.Settings:
    return operator_settings.Settings.from_env({**ENV, **env}).validate()


def _pod(job: Mapping[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = job["spec"]["template"]["spec"]
    return pod


def test_settings_reach_the_pod_spec() -> None:
    s = _settings()
    job = benchmarks.build_job("NVIDIA-L4", now=NOW, namespace=s.benchmark_namespace,
                               options=benchmark_loop.job_options(s))
    pod = _pod(job)
    assert pod["tolerations"] == [TAINT]
    assert pod["priorityClassName"] == "batch-low"
    # The chart's selector is added to; the product label is what the Job measures, so it wins.
    assert pod["nodeSelector"] == {"pool": "gpu", "nvidia.com/gpu.product": "NVIDIA-L4"}
    [c] = pod["containers"]
    assert c["resources"] == {"requests": {"cpu": "4", "memory": "16Gi"},
                              "limits": {"memory": "32Gi", "nvidia.com/gpu": 1}}
    assert c["args"] == ["bench", "--device", "cuda", "--backend", "torch",
                         "--budget-minutes", "45", "--sweep", "/sweeps"]
    assert job["spec"]["activeDeadlineSeconds"] == 45 * 60 + benchmarks.DEADLINE_MARGIN_SECONDS


def test_defaults_leave_priority_and_tolerations_out() -> None:
    s = operator_settings.Settings.from_env(
        {k: v for k, v in ENV.items() if "TOLERATIONS" not in k and "PRIORITY" not in k
         and "RESOURCES" not in k and "NODE_SELECTOR" not in k}).validate()
    pod = _pod(benchmarks.build_job("NVIDIA-L4", now=NOW, namespace="ml",
                                    options=benchmark_loop.job_options(s)))
    assert "tolerations" not in pod and "priorityClassName" not in pod
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-L4"}
    assert pod["containers"][0]["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert pod["containers"][0]["args"][3:5] == ["--backend", "torch"]


def test_onnxruntime_is_selectable_and_other_backends_are_refused() -> None:
    s = _settings(GPUPLAN_BENCHMARK_BACKEND="onnxruntime")
    args = benchmarks.bench_args(benchmark_loop.job_options(s))
    assert args[args.index("--backend") + 1] == "onnxruntime"
    with pytest.raises(errors.SettingsError, match="benchmark_backend"):
        _settings(GPUPLAN_BENCHMARK_BACKEND="tensorrt")


@pytest.mark.parametrize(("name", "raw", "field"), [
    ("TOLERATIONS_JSON", "{not json", "benchmark_tolerations_json"),
    ("TOLERATIONS_JSON", '{"key": "a"}', "benchmark_tolerations_json"),
    ("NODE_SELECTOR_JSON", '{"pool": 3}', "benchmark_node_selector_json"),
    ("RESOURCES_JSON", '{"requestz": {}}', "benchmark_resources_json"),
    ("PRIORITY_CLASS_NAME", "Not_A_Name", "benchmark_priority_class_name"),
])
def test_bad_pod_settings_are_named(name: str, raw: str, field: str) -> None:
    with pytest.raises(errors.SettingsError, match=field):
        _settings(**{f"GPUPLAN_BENCHMARK_{name}": raw})


def test_the_pod_runs_as_a_non_root_user_with_a_read_only_root() -> None:
    job = benchmarks.build_job("NVIDIA-L4", now=NOW, namespace="ml",
                               options=benchmark_loop.job_options(_settings()))
    pod = _pod(job)
    assert pod["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532, "fsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"}}
    [c] = pod["containers"]
    sc = c["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    # Everything the bench writes (HOME, caches, TMPDIR) lands on an emptyDir.
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = {e["name"]: e.get("value") for e in c["env"]}
    for var in ("HOME", "TMPDIR", "XDG_CACHE_HOME"):
        path = str(env[var])
        mount = next(m for m in mounts if path == m or path.startswith(m + "/"))
        assert volumes[mounts[mount]] == {"name": mounts[mount], "emptyDir": {}}


def test_preemption_is_retried_free_and_a_spent_budget_ends_the_job() -> None:
    spec = benchmarks.build_job("NVIDIA-L4", now=NOW, namespace="ml",
                                options=benchmark_loop.job_options(_settings()))["spec"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy needs it
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore",
                      "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert fail["action"] == "FailJob"
    assert fail["onExitCodes"] == {"containerName": "bench", "operator": "In", "values": [5]}
    assert spec["backoffLimit"] == 2


def test_retries_run_the_same_command() -> None:
    """A retried pod comes from the same template, and a Job built again (a restarted operator,
    the same day) is the same Job: the bench resumes by run identity, which needs the same args."""
    options = benchmark_loop.job_options(_settings())
    first = benchmarks.build_job("NVIDIA-L4", now=NOW, namespace="ml", options=options)
    later = benchmarks.build_job("NVIDIA-L4", now=NOW + dt.timedelta(hours=3), namespace="ml",
                                 options=benchmark_loop.job_options(_settings()))
    assert first == later
    assert not any("$" in a or "date" in a for a in _pod(first)["containers"][0]["args"])


def _cond(kind: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


POLICY_MSG = ("Container bench for pod ml/gpuplan-bench-x-1 failed with exit code {} matching "
              "FailJob rule at index 1")


@pytest.mark.parametrize(("conditions", "expected"), [
    ([], None),
    ([_cond("FailureTarget", "PodFailurePolicy", POLICY_MSG.format(5))], None),  # not yet Failed
    ([_cond("SuccessCriteriaMet"), _cond("Complete")], Outcome.SUCCEEDED),
    ([_cond("FailureTarget", "PodFailurePolicy", POLICY_MSG.format(5)),
      _cond("Failed", "PodFailurePolicy", POLICY_MSG.format(5))], Outcome.BUDGET_SPENT),
    ([_cond("Failed", "PodFailurePolicy", POLICY_MSG.format(1))], Outcome.FAILED),
    ([_cond("Failed", "PodFailurePolicy", POLICY_MSG.format(51))], Outcome.FAILED),
    ([_cond("Failed", "BackoffLimitExceeded", "Job has reached the specified backoff limit")],
     Outcome.FAILED),
    ([_cond("Failed", "DeadlineExceeded", "Job was active longer than specified deadline")],
     Outcome.FAILED),
    ([{"type": "Complete", "status": "False"}], None),
])
def test_outcome_from_the_job_conditions(conditions: list[dict[str, Any]],
                                         expected: str | None) -> None:
    assert benchmarks.outcome({"status": {"conditions": conditions}}) == expected


class JobsKube:
    """Stands in for `kube.Kube`: GPU nodes, and a Job list the test changes between passes."""

    def __init__(self, products: list[str]) -> None:
        self.nodes = [{"metadata": {"name": f"n{i}", "labels": {"nvidia.com/gpu.product": p}},
                       "status": {"allocatable": {"nvidia.com/gpu": "1"},
                                  "conditions": [{"type": "Ready", "status": "True"}]}}
                      for i, p in enumerate(products)]
        self.jobs: list[dict[str, Any]] = []
        self.created: list[dict[str, Any]] = []

    async def list_gpu_nodes(self) -> list[dict[str, Any]]:
        return self.nodes

    async def list_jobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        return self.jobs

    async def create_job(self, namespace: str, body: Mapping[str, Any]
                         ) -> tuple[dict[str, Any], bool]:
        self.created.append(dict(body))
        return dict(body), True


def _job(uid: str, product: str, *conditions: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "name": f"gpuplan-bench-{uid}",
                         "labels": {benchmarks.PRODUCT_LABEL: product}},
            "status": {"conditions": list(conditions)}}


def _app(bundle_devices: list[str], rows: Mapping[str, tuple[int, dt.datetime | None]]) -> Any:
    context = planner.PlannerContext(catalog=devices.load_catalog(),
                                     predictor=roofline.RooflinePredictor(),
                                     predictor_source="roofline",
                                     # device_rows: what /v1/coverage reports as bundle_rows
                                     manifest={"devices": bundle_devices,
                                               "device_rows": {d: 500 for d in bundle_devices}})
    return service.make_app(service.ServiceState(functools.partial(work.given_context, context)),
                            service.ServiceSettings(bundle_poll_s=3600),
                            coverage_source=lambda: rows)


def _value(registry: prometheus_client.CollectorRegistry, name: str,
           **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


def test_finished_jobs_are_counted_once_by_outcome() -> None:
    kube = JobsKube(["NVIDIA-L4", "Tesla-T4"])
    registry = prometheus_client.CollectorRegistry()
    # Finished before this operator started: counted by the previous process, not again.
    kube.jobs = [_job("old", "NVIDIA-L4", _cond("Failed", "BackoffLimitExceeded"))]

    async def passes() -> list[list[benchmarks.GpuTypeCoverage]]:
        async with LocalServer(_app([], {})) as srv:
            cfg = _settings(GPUPLAN_ESTIMATOR_URL=srv.url)
            ctx = benchmark_loop.LoopContext(
                kube=kube, settings=cfg, metrics=metrics.OperatorMetrics(registry),  # type: ignore[arg-type]
                clock=lambda: NOW, resolve=benchmarks.catalog_resolver(devices.load_catalog()))
            out = [await benchmark_loop.refresh(ctx)]
            kube.jobs += [
                _job("a", "NVIDIA-L4", _cond("Failed", "PodFailurePolicy", POLICY_MSG.format(5))),
                _job("b", "Tesla-T4", _cond("Complete")),
                _job("c", "Tesla-T4", _cond("Failed", "BackoffLimitExceeded")),
                _job("d", "Tesla-T4")]  # still running
            out.append(await benchmark_loop.refresh(ctx))
            out.append(await benchmark_loop.refresh(ctx))  # nothing new: no double count
            return out

    first, *_ = asyncio.run(passes())
    name = "gpuplan_benchmark_jobs_total"
    assert _value(registry, name, gpu_type="NVIDIA-L4", outcome=Outcome.FAILED) == 0
    assert _value(registry, name, gpu_type="NVIDIA-L4", outcome=Outcome.BUDGET_SPENT) == 1
    assert _value(registry, name, gpu_type="NVIDIA-L4", outcome=Outcome.SUCCEEDED) == 0
    assert _value(registry, name, gpu_type="Tesla-T4", outcome=Outcome.SUCCEEDED) == 1
    assert _value(registry, name, gpu_type="Tesla-T4", outcome=Outcome.FAILED) == 1
    assert _value(registry, name, gpu_type="Tesla-T4", outcome=Outcome.BUDGET_SPENT) == 0
    assert {c.action for c in first} == {benchmarks.Action.MISSING}


def test_a_type_the_served_bundle_covers_gets_no_job_and_does_not_alert() -> None:
    """Issue #17: the operator ignored `in_bundle`, so GpuplanGpuTypeWithoutData fired for types
    the shipped bundle covers, and benchmark Jobs started for them."""
    kube = JobsKube(["NVIDIA-L4", "Tesla-T4"])
    registry = prometheus_client.CollectorRegistry()

    async def one_pass() -> list[benchmarks.GpuTypeCoverage]:
        async with LocalServer(_app(["l4"], {})) as srv:
            ctx = benchmark_loop.LoopContext(
                kube=kube, settings=_settings(GPUPLAN_ESTIMATOR_URL=srv.url),  # type: ignore[arg-type]
                metrics=metrics.OperatorMetrics(registry), clock=lambda: NOW,
                resolve=benchmarks.catalog_resolver(devices.load_catalog()))
            return await benchmark_loop.refresh(ctx)

    got = asyncio.run(one_pass())
    assert [(c.gpu_type, c.action) for c in got] == [
        ("NVIDIA-L4", benchmarks.Action.BUNDLED), ("Tesla-T4", benchmarks.Action.MISSING)]
    assert [b["metadata"]["labels"][benchmarks.PRODUCT_LABEL] for b in kube.created] == [
        "Tesla-T4"]
    assert _value(registry, "gpuplan_gpu_type_in_bundle", gpu_type="NVIDIA-L4") == 1
    assert _value(registry, "gpuplan_gpu_type_in_bundle", gpu_type="Tesla-T4") == 0


def test_parse_coverage_reads_bundle_rows_when_present() -> None:
    got = estimator_client.parse_coverage({"devices": {
        "l4": {"measurements": 0, "newest_run_unix": None, "in_bundle": True,
               "bundle_rows": 0},
        "t4": {"measurements": 3, "newest_run_unix": None, "in_bundle": True,
               "bundle_rows": 812},
        "a10": {"measurements": 0, "newest_run_unix": None, "in_bundle": True}}})
    assert (got["l4"].bundle_rows, got["t4"].bundle_rows, got["a10"].bundle_rows) == (0, 812, None)
    assert [got[k].bundle_covers for k in ("l4", "t4", "a10")] == [False, True, True]
    with pytest.raises(errors.EstimatorProtocolError, match=r"devices\.l4"):
        estimator_client.parse_coverage({"devices": {"l4": {
            "measurements": 0, "newest_run_unix": None, "in_bundle": True,
            "bundle_rows": "many"}}})

