"""The chart passes the benchmark settings to the operator exactly as `Settings.from_env` reads
them, and enables benchmark Jobs only when they have a database to write to."""

from __future__ import annotations

import datetime

import pytest
import yaml

from gpuplan_operator import benchmark_loop
from gpuplan_operator.core import benchmarks, retraining, settings
from gpuplan_testing.helm_render import render


def _operator_env(*sets: str) -> dict[str, str]:
    out = render(*sets, namespace="ml-infra")
    assert out.returncode == 0, out.stderr
    for doc in yaml.safe_load_all(out.stdout):
        if doc and doc["kind"] == "Deployment" and doc["metadata"]["name"].endswith("-operator"):
            [container] = doc["spec"]["template"]["spec"]["containers"]
            return {e["name"]: e["value"] for e in container["env"] if "value" in e}
    raise AssertionError("no operator Deployment rendered")


def test_benchmarks_follow_the_estimator_database_secret() -> None:
    env = _operator_env("estimator.database.urlSecret=perfdb",
                        "operator.benchmarks.maxAgeDays=14")
    cfg = settings.Settings.from_env(env).validate()
    assert cfg.benchmarks_enabled and cfg.benchmark_max_age_days == 14
    assert cfg.benchmark_db_secret == "perfdb" and cfg.benchmark_namespace == "ml-infra"
    assert cfg.benchmark_image == "ghcr.io/gpuplan/gpuplan-bench-cuda:0.1.0"
    assert (cfg.benchmark_interval_seconds, cfg.benchmark_budget_minutes) == (3600, 90)


def test_own_secret_overrides_and_no_secret_disables_jobs() -> None:
    own = _operator_env("estimator.database.urlSecret=perfdb", "operator.benchmarks.dbSecret=b")
    assert own["GPUPLAN_BENCHMARK_DB_SECRET"] == "b"
    # SQLite on the estimator's volume: a Job on another node could not write to it.
    default = settings.Settings.from_env(_operator_env()).validate()
    assert not default.benchmarks_enabled
    off = _operator_env("estimator.database.urlSecret=perfdb", "operator.benchmarks.enabled=false")
    assert off["GPUPLAN_BENCHMARKS_ENABLED"] == "false"


@pytest.mark.parametrize(("setting", "field"), [
    ("operator.benchmarks.dbSecret=Not_A_Name", "dbSecret"),
    ("operator.benchmarks.intervalSeconds=1", "intervalSeconds"),
    ("operator.benchmarks.image.repository=", "repository"),
])
def test_bad_benchmark_values_are_rejected(setting: str, field: str) -> None:
    out = render(setting, namespace="ml-infra")
    assert out.returncode != 0 and field in out.stderr


def test_pod_values_reach_the_benchmark_job() -> None:
    """values.yaml → operator env → Settings → the Job the operator creates (issue #17)."""
    env = _operator_env(
        "estimator.database.urlSecret=perfdb",
        "operator.benchmarks.tolerations[0].key=nvidia.com/gpu",
        "operator.benchmarks.tolerations[0].operator=Exists",
        "operator.benchmarks.tolerations[0].effect=NoSchedule",
        "operator.benchmarks.priorityClassName=gpu-batch-low",
        "operator.benchmarks.nodeSelector.pool=a100",
        "operator.benchmarks.resources.requests.cpu=4",
        "operator.benchmarks.resources.limits.memory=32Gi",
        "operator.benchmarks.backend=onnxruntime",
        "operator.benchmarks.budgetMinutes=45")
    cfg = settings.Settings.from_env(env).validate()
    job = benchmarks.build_job("NVIDIA-A100-SXM4-80GB", now=datetime.datetime.now(datetime.UTC),
                               namespace=cfg.benchmark_namespace,
                               options=benchmark_loop.job_options(cfg))
    pod = job["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists",
                                   "effect": "NoSchedule"}]
    assert pod["priorityClassName"] == "gpu-batch-low"
    assert pod["nodeSelector"] == {"pool": "a100",
                                   "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    [c] = pod["containers"]
    assert c["resources"] == {"requests": {"cpu": 4},
                              "limits": {"memory": "32Gi", "nvidia.com/gpu": 1}}
    assert c["args"] == ["bench", "--device", "cuda", "--backend", "onnxruntime",
                         "--budget-minutes", "45", "--sweep", "/sweeps"]


def test_default_values_give_torch_jobs_without_extras() -> None:
    cfg = settings.Settings.from_env(_operator_env("estimator.database.urlSecret=perfdb"))
    cfg.validate()
    assert (cfg.benchmark_backend, cfg.benchmark_priority_class_name) == ("torch", "")
    assert (cfg.benchmark_tolerations(), cfg.benchmark_node_selector(),
            cfg.benchmark_resources()) == ([], {}, {})


@pytest.mark.parametrize(("setting", "field"), [
    ("operator.benchmarks.backend=tensorrt", "backend"),
    ("operator.benchmarks.priorityClassName=Not_A_Class", "priorityClassName"),
    ("operator.benchmarks.tolerations[0].operator=Maybe", "operator"),
    ("operator.benchmarks.tolerations[0].colour=blue", "colour"),
    ("operator.benchmarks.resources.requestz.cpu=1", "requestz"),
])
def test_bad_benchmark_pod_values_are_rejected(setting: str, field: str) -> None:
    out = render(setting, namespace="ml-infra")
    assert out.returncode != 0 and field in out.stderr


def test_retraining_is_off_by_default_and_needs_the_database() -> None:
    default = settings.Settings.from_env(_operator_env("estimator.database.urlSecret=perfdb"))
    assert not default.validate().retraining_enabled
    assert default.retraining_interval_seconds() == 0 and default.retraining_max_rows == 60000
    # On SQLite in the estimator's volume a training Job could not reach the rows.
    no_db = _operator_env("operator.retraining.enabled=true")
    assert no_db["GPUPLAN_RETRAINING_ENABLED"] == "false"


def test_retraining_values_reach_the_training_job() -> None:
    """values.yaml → operator env → Settings → the training Job the operator creates."""
    env = _operator_env("estimator.database.urlSecret=perfdb", "operator.retraining.enabled=true",
                        "operator.retraining.interval=7d", "operator.retraining.maxRows=2000000",
                        "operator.retraining.resources.requests.cpu=2",
                        "operator.retraining.resources.limits.memory=8Gi", "image.tag=0.2.0")
    cfg = settings.Settings.from_env(env).validate()
    assert cfg.retraining_enabled and cfg.retraining_interval_seconds() == 7 * 86400
    job = retraining.build_job(retraining.Trigger("schedule", "1"),
                               namespace=cfg.benchmark_namespace,
                               options=benchmark_loop.retraining_options(cfg))
    [c] = job["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "ghcr.io/gpuplan/gpuplan:0.2.0"  # the estimator's image
    assert c["args"][-2:] == ["--max-rows", "2000000"]
    assert c["resources"] == {"requests": {"cpu": 2}, "limits": {"memory": "8Gi"}}
    assert c["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "perfdb", "key": "url"}
    assert job["metadata"]["namespace"] == "ml-infra"


@pytest.mark.parametrize(("setting", "field"), [
    ("operator.retraining.interval=daily", "interval"),
    ("operator.retraining.interval=24", "interval"),
    ("operator.retraining.maxRows=10", "maxRows"),
    ("operator.retraining.resources.requestz.cpu=1", "requestz"),
    ("operator.retraining.schedule=1h", "schedule"),
])
def test_bad_retraining_values_are_rejected(setting: str, field: str) -> None:
    out = render(setting, namespace="ml-infra")
    assert out.returncode != 0 and field in out.stderr
