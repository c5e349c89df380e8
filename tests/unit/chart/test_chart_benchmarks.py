"""The chart passes the benchmark settings to the operator exactly as `Settings.from_env` reads
them, and enables benchmark Jobs only when they have a database to write to."""

from __future__ import annotations

import pytest
import yaml

from gpuplan_operator import settings
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
