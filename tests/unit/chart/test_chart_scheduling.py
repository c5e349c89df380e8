"""Issue #32: the chart's `scheduling` values reach the operator's settings, and the operator
may do what living beside other schedulers and quotas needs (and no more)."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from gpuplan_operator.core import settings
from gpuplan_testing.helm_render import CHART, helm


def rendered(*set_json: str) -> subprocess.CompletedProcess[str]:
    args = [helm(), "template", "t", str(CHART), "--kube-version", "1.34.4"]
    for value in set_json:
        args += ["--set-json", value]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def docs(*set_json: str) -> list[dict[str, Any]]:
    out = rendered(*set_json)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def operator_env(objects: list[dict[str, Any]]) -> dict[str, str]:
    deploy = next(d for d in objects if d["kind"] == "Deployment"
                  and d["metadata"]["name"] == "t-gpuplan-operator")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_scheduling_values_become_valid_operator_settings() -> None:
    env = operator_env(docs('scheduling={"scope":"all","gangs":"off","maxExecTimeMargin":1.5}'))
    ours = {k: v for k, v in env.items() if k in {
        "GPUPLAN_SCHEDULER_SCOPE", "GPUPLAN_GANG_SCHEDULING", "GPUPLAN_MAX_EXEC_TIME_MARGIN"}}
    assert ours == {"GPUPLAN_SCHEDULER_SCOPE": "all", "GPUPLAN_GANG_SCHEDULING": "off",
                    "GPUPLAN_MAX_EXEC_TIME_MARGIN": "1.5"}
    parsed = settings.Settings.from_env({**ours, "GPUPLAN_ESTIMATOR_URL": "http://e:8080"})
    assert (parsed.validate().scheduler_scope, parsed.gang_scheduling,
            parsed.max_exec_time_margin) == ("all", "off", 1.5)


def test_defaults_are_opt_in_auto_gangs_and_no_exec_time() -> None:
    env = operator_env(docs())
    defaults = settings.Settings()
    assert env["GPUPLAN_SCHEDULER_SCOPE"] == defaults.scheduler_scope == "opt-in"
    assert env["GPUPLAN_GANG_SCHEDULING"] == defaults.gang_scheduling == "auto"
    assert float(env["GPUPLAN_MAX_EXEC_TIME_MARGIN"]) == defaults.max_exec_time_margin == 0


@pytest.mark.parametrize("value", ['scheduling={"scope":"some"}', 'scheduling={"gangs":"on"}',
                                   'scheduling={"maxExecTimeMargin":0.5}',
                                   'scheduling={"margin":1}'])
def test_bad_scheduling_values_are_refused(value: str) -> None:
    assert rendered(value).returncode != 0


def test_the_operator_may_read_quotas_create_podgroups_and_watch_events() -> None:
    role = next(d for d in docs() if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] == "t-gpuplan-operator")
    granted = {(group, resource, verb) for rule in role["rules"]
               for group in rule["apiGroups"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    for group in ("scheduling.run.ai", "scheduling.volcano.sh", "scheduling.x-k8s.io"):
        assert {(group, "podgroups", "create"), (group, "podgroups", "get")} <= granted
        assert (group, "podgroups", "delete") not in granted
    assert {("", "resourcequotas", "list"), ("", "events", "watch"), ("", "events", "list"),
            ("", "namespaces", "get")} <= granted
