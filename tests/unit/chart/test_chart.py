"""The Helm chart renders, validates its values, and carries the CRDs of crds/ unchanged."""


import pytest
import yaml

from gpuplan_testing.helm_render import CHART, ROOT, render


def test_default_render_has_every_component() -> None:
    out = render("metrics.prometheusRule.enabled=true")
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    deployments = {d["metadata"]["name"] for d in docs if d["kind"] == "Deployment"}
    assert deployments == {"t-gpuplan-estimator", "t-gpuplan-operator", "t-gpuplan-scheduler"}
    rule = next(d for d in docs if d["kind"] == "PrometheusRule")
    alerts = {r.get("alert") for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"GpuplanEstimatorDown", "GpuplanBenchmarksStale"} <= alerts


def test_scheduler_config_is_a_valid_extender_config() -> None:
    out = render()
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and "scheduler" in d["metadata"]["name"])
    config = yaml.safe_load(cm["data"]["config.yaml"])
    assert config["kind"] == "KubeSchedulerConfiguration"
    extender = config["extenders"][0]
    assert extender["nodeCacheCapable"] is True
    assert extender["httpTimeout"] == "5s"
    assert config["profiles"][0]["schedulerName"] == "gpuplan-scheduler"


def test_scheduler_can_be_disabled() -> None:
    out = render("scheduler.enabled=false")
    assert out.returncode == 0, out.stderr
    assert "kube-scheduler" not in out.stdout
    assert 'GPUPLAN_SCHEDULER_NAME, value: ""' in out.stdout


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("scheduler.extender.httpTimeout=5", "httpTimeout"),
        ("estimator.port=70000", "port"),
        ("operator.replicas=3", "replicas"),
        ("image.pullPolicy=Sometimes", "pullPolicy"),
    ],
)
def test_bad_values_are_rejected_naming_the_field(setting: str, field: str) -> None:
    out = render(setting)
    assert out.returncode != 0
    assert field in out.stderr


def test_chart_crds_are_the_source_crds() -> None:
    sources = sorted((ROOT / "crds").glob("*.yaml"))
    assert sources, "crds/ has no CRD"
    for src in sources:
        copy = CHART / "crds" / src.name
        assert copy.exists(), f"{copy} missing: run make crds"
        assert copy.read_text() == src.read_text(), f"{copy} differs from {src}: run make crds"
