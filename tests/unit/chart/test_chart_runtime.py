"""What the chart renders is what the programs accept (#16): every argument parses with the
program's own parser, every operator GPUPLAN_* variable is a setting, probes reach the pod IP,
and kube-scheduler matches the cluster's minor version."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest
import yaml

from gpuplan_estimator.interfaces.cli import main as estimator_cli
from gpuplan_estimator.interfaces.cli import serving
from gpuplan_operator import __main__ as operator_main
from gpuplan_operator.core import settings
from gpuplan_operator.extender import cli as extender_cli
from gpuplan_testing.helm_render import CHART, helm, render

# Numbers past 1e6, where Helm's float64 values print as 6.7108864e+07 unless cast.
LARGE_NUMBERS = ("estimator.maxBodyBytes=134217728", "estimator.requestTimeoutSeconds=86400",
                 "estimator.queuedPerClient=10000", "estimator.runningPerClient=2",
                 "estimator.workloadRetentionHours=87600",
                 "operator.modelUrl.maxBytes=1000000000",
                 "operator.benchmarks.intervalSeconds=2592000",
                 "operator.retraining.maxRows=10000000")


def _containers(*sets: str, kube_version: str = "1.34.4") -> dict[str, dict[str, Any]]:
    args = [helm(), "template", "t", str(CHART), "--kube-version", kube_version, "-n", "gs"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return {c["name"]: c for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"]}


def _values_file_containers(tmp_path: Any) -> dict[str, dict[str, Any]]:
    """Large numbers from a values file (parsed as float64 by Helm), as users write them."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump({
        "estimator": {"maxBodyBytes": 134217728, "requestTimeoutSeconds": 86400,
                      "workloadRetentionHours": 87600},
        "operator": {"modelUrl": {"maxBytes": 1000000000},
                     "benchmarks": {"intervalSeconds": 2592000},
                     "retraining": {"maxRows": 10000000}}}))
    out = subprocess.run([helm(), "template", "t", str(CHART), "--kube-version", "1.34.4",
                          "-f", str(values)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return {c["name"]: c for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "Deployment"
            for c in d["spec"]["template"]["spec"]["containers"]}


@pytest.mark.parametrize("source", ["defaults", "set", "values-file"])
def test_estimator_args_parse_with_the_estimator_cli(source: str, tmp_path: Any) -> None:
    containers = (_values_file_containers(tmp_path) if source == "values-file"
                  else _containers(*(LARGE_NUMBERS if source == "set" else ())))
    args = containers["estimator"]["args"]
    assert not [a for a in args if "e+" in a]
    parsed = estimator_cli.build_parser().parse_args(args)  # exits 2 on a value it refuses
    if source != "defaults":
        assert parsed.max_body_bytes == 134217728 and parsed.request_timeout == 86400
        assert parsed.workload_retention == 87600 * 3600.0
    else:
        assert parsed.workload_retention == serving.WORKLOAD_RETENTION_S  # one default


def test_extender_args_parse_with_the_extender_cli() -> None:
    [args] = [c["args"] for n, c in _containers().items() if n == "extender"]
    parsed = extender_cli.build_parser().parse_args(args)
    serve = extender_cli.settings_from_args(parsed)
    assert serve.host == "127.0.0.1"  # filter/prioritize: kube-scheduler in the pod only
    assert serve.metrics_port is not None and serve.metrics_host == "0.0.0.0"


def test_operator_args_parse_and_peer_with_distinct_priorities() -> None:
    container = _containers()["operator"]
    first = operator_main.build_parser().parse_args(container["args"])
    second = operator_main.build_parser().parse_args(container["args"])
    assert first.peering == "t-gpuplan-operator" and not first.standalone
    # Equal priorities pause every kopf peer, so two replicas must draw different ones.
    assert first.priority != second.priority and first.priority > 0
    assert "--liveness=http://0.0.0.0:8081/healthz" in operator_main.kopf_options(first)


@pytest.mark.parametrize("sets", [(), LARGE_NUMBERS, ("operator.namespaces={a,b}",
                                                      "estimator.database.urlSecret=pg",
                                                      "operator.retraining.enabled=true",
                                                      "operator.modelUrl.allowedNetworks={10.0.0.0/8}")])
def test_every_operator_variable_is_a_known_setting(sets: tuple[str, ...]) -> None:
    env = {e["name"]: e["value"] for e in _containers(*sets)["operator"]["env"]}
    assert operator_main.NAMESPACES_ENV in settings.ENTRYPOINT_VARIABLES
    known = settings.variable_names() | settings.ENTRYPOINT_VARIABLES
    assert sorted(name for name in env if name.startswith("GPUPLAN_") and name not in known) == []
    settings.Settings.from_env(env).validate()


def test_model_url_values_reach_the_settings() -> None:
    env = {e["name"]: e["value"] for e in _containers(
        "operator.modelUrl.allowPrivateAddresses=true", "operator.modelUrl.maxBytes=1000000000",
        "operator.modelUrl.timeoutSeconds=90",
        "operator.modelUrl.allowedNetworks={10.1.0.0/16,192.168.5.0/24}")["operator"]["env"]}
    cfg = settings.Settings.from_env(env).validate()
    assert cfg.model_url_block_private is False
    assert cfg.model_max_bytes == 1_000_000_000 and cfg.model_fetch_timeout_seconds == 90
    assert cfg.model_url_allowed_networks == ("10.1.0.0/16", "192.168.5.0/24")
    default = settings.Settings.from_env(
        {e["name"]: e["value"] for e in _containers()["operator"]["env"]}).validate()
    assert default.model_url_block_private is True and default.model_max_bytes == 64 * 2**20


def test_probes_target_the_pod_ip() -> None:
    containers = _containers()
    probes = {(name, kind): c[kind]["httpGet"] for name, c in containers.items()
              for kind in ("readinessProbe", "livenessProbe") if kind in c}
    assert set(probes) >= {("extender", "readinessProbe"), ("kube-scheduler", "readinessProbe"),
                           ("estimator", "readinessProbe"), ("operator", "livenessProbe")}
    assert {k: "host" in p for k, p in probes.items()} == {k: False for k in probes}
    # Named ports resolve to a declared containerPort of the same container.
    for (name, _), probe in probes.items():
        ports = {p["name"]: p["containerPort"] for p in containers[name].get("ports", [])}
        assert isinstance(probe["port"], str) and probe["port"] in ports, (name, probe)
    extender = containers["extender"]
    metrics_port = extender["args"][extender["args"].index("--metrics-port") + 1]
    ports = {p["name"]: str(p["containerPort"]) for p in extender["ports"]}
    assert ports["metrics"] == metrics_port


def test_scheduler_may_read_the_apiserver_authentication_config() -> None:
    out = render()
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    [binding] = [d for d in docs if d["kind"] == "RoleBinding"
                 and d["roleRef"]["name"] == "extension-apiserver-authentication-reader"]
    assert binding["metadata"]["namespace"] == "kube-system"
    assert binding["roleRef"]["kind"] == "Role"
    assert binding["subjects"][0]["name"] == "t-gpuplan-scheduler"


def test_estimator_replicas_without_database_fail_in_the_template_too() -> None:
    """The template's own check, with schema validation skipped (a chart consumed as a
    subchart by tools that skip it still refuses)."""
    args = [helm(), "template", "t", str(CHART), "--kube-version", "1.34.4",
            "--skip-schema-validation", "--set", "estimator.replicas=2"]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "estimator.replicas > 1 needs estimator.database.urlSecret" in out.stderr
