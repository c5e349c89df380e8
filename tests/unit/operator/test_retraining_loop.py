"""The benchmark loop starts retraining (issue #17): against a real estimator service whose
coverage comes from a table the test changes, one training Job after a benchmark Job succeeded
with new rows, none when disabled, none while one runs, each finished one counted once; the
GPUPLAN_RETRAINING_* settings."""

from __future__ import annotations

import asyncio
import datetime as dt
import functools
from collections.abc import Mapping
from typing import Any

import prometheus_client
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.interfaces.http import service, work
from gpuplan_estimator.planning import planner
from gpuplan_operator import benchmark_loop, metrics
from gpuplan_operator.core import benchmarks, errors, retraining
from gpuplan_operator.core import settings as operator_settings
from gpuplan_testing.operator_builders import LocalServer

NOW = dt.datetime(2026, 6, 15, 8, 30, tzinfo=dt.UTC)
ENV = {"GPUPLAN_ESTIMATOR_URL": "http://est:8080", "GPUPLAN_BENCHMARKS_ENABLED": "true",
       "GPUPLAN_BENCHMARK_IMAGE": "reg/bench:1", "GPUPLAN_BENCHMARK_DB_SECRET": "perfdb",
       "GPUPLAN_BENCHMARK_NAMESPACE": "ml", "GPUPLAN_RETRAINING_ENABLED": "true",
       "GPUPLAN_RETRAINING_IMAGE": "reg/gpuplan:1", "GPUPLAN_RETRAINING_MAX_ROWS": "5000"}
RETRAINING = f"{benchmarks.COMPONENT_LABEL}={retraining.COMPONENT}"


class LabelledKube:
    """Stands in for `kube.Kube`: GPU nodes and Jobs listed by their component label (as the
    API server's label selector does), creates that add the Job (409 → the existing one)."""

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
        key, value = label_selector.split("=")
        return [j for j in self.jobs if j["metadata"]["namespace"] == namespace
                and j["metadata"]["labels"].get(key) == value]

    async def create_job(self, namespace: str, body: Mapping[str, Any]
                         ) -> tuple[dict[str, Any], bool]:
        name = body["metadata"]["name"]
        for job in self.jobs:
            if job["metadata"]["name"] == name:
                return job, False
        job = {**dict(body), "metadata": {**body["metadata"], "uid": f"uid-{name}"},
               "status": {}}
        self.jobs.append(job)
        self.created.append(job)
        return job, True

    def training_jobs(self) -> list[dict[str, Any]]:
        return [j for j in self.created
                if j["metadata"]["labels"][benchmarks.COMPONENT_LABEL] == retraining.COMPONENT]

    def finish(self, name_prefix: str, condition: dict[str, Any]) -> None:
        for job in self.jobs:
            if job["metadata"]["name"].startswith(name_prefix):
                job["status"] = {"conditions": [condition]}


def _cond(kind: str, reason: str = "", message: str = "") -> dict[str, Any]:
    return {"type": kind, "status": "True", "reason": reason, "message": message}


REFUSED = _cond("Failed", "PodFailurePolicy", "Container train for pod ml/p failed with exit "
                "code 3 matching FailJob rule at index 1")


def _app(rows: dict[str, tuple[int, dt.datetime | None]]) -> Any:
    """A real estimator service; `rows` (device → rows, newest run) is read on every request."""
    context = planner.PlannerContext(catalog=devices.load_catalog(),
                                     predictor=roofline.RooflinePredictor(),
                                     predictor_source="roofline", manifest={"devices": []})
    return service.make_app(service.ServiceState(functools.partial(work.given_context, context)),
                            service.ServiceSettings(bundle_poll_s=3600),
                            coverage_source=lambda: rows)


def _run_passes(kube: LabelledKube, rows: dict[str, tuple[int, dt.datetime | None]],
                registry: prometheus_client.CollectorRegistry, steps: list[Any],
                **env: str) -> None:
    """One loop pass per step; a step (called before its pass) changes the cluster or rows."""
    async def main() -> None:
        async with LocalServer(_app(rows)) as srv:
            cfg = operator_settings.Settings.from_env(
                {**ENV, **env, "GPUPLAN_ESTIMATOR_URL": srv.url}).validate()
            ctx = benchmark_loop.LoopContext(
                kube=kube, settings=cfg, metrics=metrics.OperatorMetrics(registry),  # type: ignore[arg-type]
                clock=lambda: NOW, resolve=benchmarks.catalog_resolver(devices.load_catalog()))
            for step in steps:
                step()
                await benchmark_loop.refresh(ctx)

    asyncio.run(main())


def _bench_done(kube: LabelledKube, rows: dict[str, tuple[int, dt.datetime | None]],
                measured: int) -> Any:
    """The L4 benchmark Job succeeds having written `measured` rows."""
    def step() -> None:
        kube.finish(benchmarks.NAME_PREFIX + "nvidia-l4", _cond("Complete"))
        rows["l4"] = (measured, NOW)
    return step


def _retrained(registry: prometheus_client.CollectorRegistry, outcome: str) -> float | None:
    return registry.get_sample_value("gpuplan_retraining_jobs_total", {"outcome": outcome})


def test_a_succeeded_benchmark_with_new_rows_starts_exactly_one_training_job() -> None:
    kube = LabelledKube(["NVIDIA-L4"])
    rows: dict[str, tuple[int, dt.datetime | None]] = {}
    registry = prometheus_client.CollectorRegistry()
    _run_passes(kube, rows, registry, [
        lambda: None,                       # no data: the benchmark Job is created
        _bench_done(kube, rows, 4800),      # it succeeded with rows: a training Job
        lambda: None,                       # nothing new: still one
    ])
    [job] = kube.training_jobs()
    [bench] = [j for j in kube.created if j not in kube.training_jobs()]
    assert job["metadata"]["name"] == retraining.job_name(
        retraining.Trigger("benchmark", bench["metadata"]["uid"]))
    assert job["metadata"]["namespace"] == "ml"
    [c] = job["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "reg/gpuplan:1"
    assert c["args"] == ["train", "--db", "$(GPUPLAN_DB_URL)", "--candidate", "--promote",
                         "--max-rows", "5000"]
    assert _retrained(registry, retraining.RetrainOutcome.PROMOTED) == 0


def test_no_training_job_when_disabled_or_without_new_rows() -> None:
    for env, measured in (({"GPUPLAN_RETRAINING_ENABLED": "false"}, 4800), ({}, 0)):
        kube = LabelledKube(["NVIDIA-L4"])
        rows: dict[str, tuple[int, dt.datetime | None]] = {}
        _run_passes(kube, rows, prometheus_client.CollectorRegistry(),
                    [lambda: None, _bench_done(kube, rows, measured), lambda: None], **env)
        assert kube.training_jobs() == [], (env, measured)
        assert len(kube.created) == 1  # the benchmark Job


def test_one_at_a_time_then_the_waiting_trigger_and_each_outcome_counted_once() -> None:
    kube = LabelledKube(["NVIDIA-L4", "Tesla-T4"])
    rows: dict[str, tuple[int, dt.datetime | None]] = {}
    registry = prometheus_client.CollectorRegistry()

    def t4_done() -> None:  # succeeds while the first training Job still runs
        kube.finish(benchmarks.NAME_PREFIX + "tesla-t4", _cond("Complete"))
        rows["t4"] = (900, NOW)

    _run_passes(kube, rows, registry, [
        lambda: None,                       # two benchmark Jobs created
        _bench_done(kube, rows, 4800),      # L4 done: training Job 1
        t4_done,                            # T4 done, but Job 1 runs: it waits
        lambda: None,
        lambda: kube.finish(retraining.NAME_PREFIX, REFUSED),  # Job 1 refused: Job 2 starts
        lambda: None,                       # nothing new; Job 1 not counted twice
    ])
    first, second = kube.training_jobs()
    assert first["metadata"]["name"] != second["metadata"]["name"]
    assert first["status"] == {"conditions": [REFUSED]} and second["status"] == {}
    assert _retrained(registry, retraining.RetrainOutcome.REFUSED) == 1
    assert _retrained(registry, retraining.RetrainOutcome.PROMOTED) == 0


def test_training_jobs_finished_before_a_restart_are_not_counted_again() -> None:
    kube = LabelledKube(["NVIDIA-L4"])
    rows: dict[str, tuple[int, dt.datetime | None]] = {"l4": (4800, NOW)}
    old = retraining.build_job(retraining.Trigger("schedule", "1"), namespace="ml", options=(
        retraining.RetrainJobOptions(image="reg/gpuplan:1", db_secret="perfdb", max_rows=5000)))
    kube.jobs.append({**old, "metadata": {**old["metadata"], "uid": "old"},
                      "status": {"conditions": [_cond("Complete")]}})
    registry = prometheus_client.CollectorRegistry()
    _run_passes(kube, rows, registry, [lambda: None, lambda: None])
    assert _retrained(registry, retraining.RetrainOutcome.PROMOTED) == 0
    assert kube.created == []  # L4 has fresh rows: no benchmark, no training


def test_a_benchmark_that_ended_while_the_operator_was_down_still_starts_its_training() -> None:
    kube = LabelledKube(["NVIDIA-L4"])
    rows: dict[str, tuple[int, dt.datetime | None]] = {}
    _run_passes(kube, rows, prometheus_client.CollectorRegistry(), [lambda: None])
    _bench_done(kube, rows, 4800)()  # no operator runs while the benchmark Job ends
    for _restart in range(2):  # a second restart finds the training Job: no other one
        _run_passes(kube, rows, prometheus_client.CollectorRegistry(),
                    [lambda: None, lambda: None])
    [job] = kube.training_jobs()
    [bench] = [j for j in kube.created if j not in kube.training_jobs()]
    assert job["metadata"]["name"] == retraining.job_name(
        retraining.Trigger("benchmark", bench["metadata"]["uid"]))


def test_the_schedule_starts_one_job_per_slot() -> None:
    kube = LabelledKube(["NVIDIA-L4"])
    rows: dict[str, tuple[int, dt.datetime | None]] = {"l4": (4800, NOW)}
    registry = prometheus_client.CollectorRegistry()
    _run_passes(kube, rows, registry, [
        lambda: None, lambda: kube.finish(retraining.NAME_PREFIX, _cond("Complete")),
        lambda: None], GPUPLAN_RETRAINING_INTERVAL="1d")
    [job] = kube.training_jobs()
    slot = str(int(NOW.timestamp()) // 86400)
    assert job["metadata"]["name"] == retraining.job_name(retraining.Trigger("schedule", slot))
    assert _retrained(registry, retraining.RetrainOutcome.PROMOTED) == 1


def test_retraining_settings_from_env() -> None:
    s = operator_settings.Settings.from_env({
        **ENV, "GPUPLAN_RETRAINING_INTERVAL": "1h30m",
        "GPUPLAN_RETRAINING_RESOURCES_JSON": '{"requests": {"cpu": "2"}}'}).validate()
    assert s.retraining_enabled and s.retraining_interval_seconds() == 5400
    assert benchmark_loop.retraining_options(s) == retraining.RetrainJobOptions(
        image="reg/gpuplan:1", db_secret="perfdb", max_rows=5000,
        resources={"requests": {"cpu": "2"}})
    off = operator_settings.Settings.from_env({"GPUPLAN_ESTIMATOR_URL": "http://e:1"}).validate()
    assert (off.retraining_enabled, off.retraining_interval_seconds()) == (False, 0)


@pytest.mark.parametrize(("env", "field"), [
    ({"GPUPLAN_RETRAINING_INTERVAL": "daily"}, "retraining_interval"),
    ({"GPUPLAN_RETRAINING_INTERVAL": "24"}, "retraining_interval"),
    ({"GPUPLAN_RETRAINING_MAX_ROWS": "10"}, "retraining_max_rows"),
    ({"GPUPLAN_RETRAINING_RESOURCES_JSON": '{"requestz": {}}'}, "retraining_resources_json"),
    ({"GPUPLAN_RETRAINING_IMAGE": ""}, "retraining_image"),
    ({"GPUPLAN_BENCHMARK_DB_SECRET": "", "GPUPLAN_BENCHMARKS_ENABLED": "false"},
     "retraining_enabled: needs benchmark_db_secret"),
])
def test_bad_retraining_settings_are_named(env: dict[str, str], field: str) -> None:
    with pytest.raises(errors.SettingsError, match=field):
        operator_settings.Settings.from_env({**ENV, **env}).validate()
