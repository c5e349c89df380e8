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
        ("operator.replicas=-1", "replicas"),  # peering: any count >= 0 (#16)
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


def _policy_docs(*sets: str) -> list[dict[str, object]]:
    out = render(*sets)
    assert out.returncode == 0, out.stderr
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    return [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] in kinds]


def test_admission_policy_is_on_by_default_and_bound_to_itself() -> None:
    policy, binding = _policy_docs()
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]
    assert isinstance(spec, dict) and isinstance(binding["spec"], dict)
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]  # type: ignore[index]
    assert binding["spec"]["validationActions"] == ["Deny"]
    assert spec["failurePolicy"] == "Fail"
    rule = spec["matchConstraints"]["resourceRules"][0]
    assert (rule["resources"], rule["operations"]) == (["trainingjobs"], ["CREATE", "UPDATE"])
    first, *escalations = spec["validations"]
    assert "resource('jobs')" in first["expression"] and "check('create')" in first["expression"]
    assert len(escalations) == 8  # at most two authorizer checks per expression (cost limit)
    for v in escalations:
        assert v["expression"].count(".check(") == 2, v["expression"]
    assert "may get secrets while" in escalations[0]["messageExpression"]


def test_admission_policy_toggles() -> None:
    assert _policy_docs("admissionPolicy.enabled=false") == []
    policy, _ = _policy_docs("admissionPolicy.restrictServiceAccounts=false")
    assert len(policy["spec"]["validations"]) == 1  # type: ignore[index]
    out = render("admissionPolicy.enabled=yes")
    assert out.returncode != 0 and "enabled" in out.stderr
