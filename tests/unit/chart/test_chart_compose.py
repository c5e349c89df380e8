"""The chart composes (#32 item 2): it works as a subchart of an umbrella chart (Helm's `global`),
takes the usual naming, placement, priority, digest and pull-secret values, types its
Kubernetes-shaped values, and refuses wrong ones naming the value."""

from __future__ import annotations

import datetime
import pathlib
import shutil
import subprocess
from typing import Any

import pytest
import yaml

from gpuplan_operator import benchmark_loop
from gpuplan_operator.core import benchmarks, errors, retraining, settings
from gpuplan_testing.helm_render import CHART, ROOT, built_kube_version, helm, render

UMBRELLA = ROOT / "tests" / "fixtures" / "charts" / "umbrella"
DIGEST = "sha256:" + "0123456789abcdef" * 4
OPERATOR_JOBS_NAMESPACE = "ml-infra"


def _docs(*sets: str) -> list[dict[str, Any]]:
    out = render(*sets, namespace=OPERATOR_JOBS_NAMESPACE)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _pod_specs(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each Deployment's pod spec by the Deployment's name."""
    return {d["metadata"]["name"]: d["spec"]["template"]["spec"]
            for d in docs if d["kind"] == "Deployment"}


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    [spec] = [s for n, s in _pod_specs(docs).items() if n.endswith("-operator")]
    [container] = spec["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def _umbrella(tmp_path: pathlib.Path) -> pathlib.Path:
    """The fixture's umbrella chart, its dependency pointed at this checkout's chart and built."""
    chart = tmp_path / "platform"
    shutil.copytree(UMBRELLA, chart, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    meta = chart / "Chart.yaml"
    meta.write_text(meta.read_text().replace("file://../../../../charts/gpuplan",
                                             f"file://{CHART}"))
    out = subprocess.run([helm(), "dependency", "build", str(chart)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return chart


def test_umbrella_chart_lints_strictly_and_passes_global_values(tmp_path: pathlib.Path) -> None:
    chart = _umbrella(tmp_path)
    lint = subprocess.run([helm(), "lint", "--strict", str(chart)],
                          capture_output=True, text=True, timeout=120)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    out = subprocess.run([helm(), "template", "p", str(chart), "--kube-version",
                          built_kube_version(), "-n", "platform"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    [parent] = [d for d in docs
                if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "p-platform"]
    assert parent["data"]["environment"] == "staging"
    specs = _pod_specs(docs)
    assert set(specs) == {"gpuplan-estimator", "gpuplan-operator", "gpuplan-scheduler"}
    for spec in specs.values():
        assert spec["imagePullSecrets"] == [{"name": "platform-registry"},
                                            {"name": "gpuplan-registry"}]
        assert spec["priorityClassName"] == "platform-critical"
        term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["nodeSelectorTerms"][0]["matchExpressions"][0]["key"] == \
            "node-role.example.com/infra"
    env = _operator_env(docs)
    assert env["GPUPLAN_JOB_IMAGE_PULL_SECRETS"] == "platform-registry,gpuplan-registry"
    assert env["GPUPLAN_ESTIMATOR_URL"] == "http://gpuplan-estimator.platform.svc:8080"


@pytest.mark.parametrize(("sets", "prefix"), [
    ((), "t-gpuplan"),
    (("nameOverride=planner",), "t-planner"),
    (("fullnameOverride=gp",), "gp"),
])
def test_name_overrides_rename_every_object(sets: tuple[str, ...], prefix: str) -> None:
    docs = _docs(*sets)
    named = [d["metadata"]["name"] for d in docs if d["kind"] not in {"CustomResourceDefinition"}]
    # Cluster-wide objects of other charts' names (the aggregated tenant roles) also carry it.
    assert all(n.startswith(prefix) for n in named), [n for n in named
                                                      if not n.startswith(prefix)]
    # The label the alerts, dashboard and Deployment selectors read stays the chart's name.
    for spec_owner in (d for d in docs if d["kind"] == "Deployment"):
        assert spec_owner["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "gpuplan"


def test_placement_priority_and_digest_reach_every_pod() -> None:
    docs = _docs("priorityClassName=gpuplan-high", f"image.digest={DIGEST}",
                 "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
                 ".weight=50",
                 "affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution[0]"
                 ".podAffinityTerm.topologyKey=topology.kubernetes.io/zone",
                 "tolerations[0].key=dedicated", "tolerations[0].operator=Exists",
                 "nodeSelector.pool=infra")
    specs = _pod_specs(docs)
    assert len(specs) == 3
    for name, spec in specs.items():
        assert spec["priorityClassName"] == "gpuplan-high", name
        assert spec["affinity"]["podAntiAffinity"][
            "preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 50
        assert spec["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]
        assert spec["nodeSelector"] == {"pool": "infra"}
        ours = [c["image"] for c in spec["containers"] if "gpuplan" in c["image"]]
        assert ours and all(i == f"ghcr.io/gpuplan/gpuplan@{DIGEST}" for i in ours), ours
    env = _operator_env(docs)
    assert env["GPUPLAN_RETRAINING_IMAGE"] == f"ghcr.io/gpuplan/gpuplan@{DIGEST}"


def test_default_topology_spread_spreads_each_component_over_nodes() -> None:
    docs = _docs()
    for name, spec in _pod_specs(docs).items():
        [constraint] = spec["topologySpreadConstraints"]
        component = name.removeprefix("t-gpuplan-")
        assert constraint == {
            "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "gpuplan",
                                              "app.kubernetes.io/instance": "t",
                                              "app.kubernetes.io/component": component}}}
        assert "priorityClassName" not in spec and "affinity" not in spec
    none = _pod_specs(_docs("topologySpreadConstraints=null"))
    assert all("topologySpreadConstraints" not in s for s in none.values())


def test_pull_secrets_reach_every_job_the_operator_creates() -> None:
    """values → operator env → Settings → the benchmark and the retraining Job."""
    docs = _docs("imagePullSecrets[0].name=registry-a", "imagePullSecrets[1].name=registry-b",
                 "estimator.database.urlSecret=perfdb", "operator.retraining.enabled=true")
    specs = _pod_specs(docs)
    assert all(s["imagePullSecrets"] == [{"name": "registry-a"}, {"name": "registry-b"}]
               for s in specs.values())
    cfg = settings.Settings.from_env(_operator_env(docs)).validate()
    bench = benchmarks.build_job("NVIDIA-A100-SXM4-80GB",
                                 now=datetime.datetime.now(datetime.UTC),
                                 namespace=cfg.benchmark_namespace,
                                 options=benchmark_loop.job_options(cfg))
    train = retraining.build_job(retraining.Trigger("schedule", "1"),
                                 namespace=cfg.benchmark_namespace,
                                 options=benchmark_loop.retraining_options(cfg))
    for job in (bench, train):
        assert job["spec"]["template"]["spec"]["imagePullSecrets"] == [
            {"name": "registry-a"}, {"name": "registry-b"}]
    plain = settings.Settings.from_env(_operator_env(_docs("estimator.database.urlSecret=db")))
    job = benchmarks.build_job("NVIDIA-A100-SXM4-80GB", now=datetime.datetime.now(datetime.UTC),
                               namespace="x", options=benchmark_loop.job_options(plain))
    assert "imagePullSecrets" not in job["spec"]["template"]["spec"]


def test_operator_refuses_a_pull_secret_that_is_no_secret_name() -> None:
    env = {"GPUPLAN_JOB_IMAGE_PULL_SECRETS": "ok-name,Not_A_Name"}
    with pytest.raises(errors.SettingsError, match="job_image_pull_secrets: 'Not_A_Name'"):
        settings.Settings.from_env(env).validate()


def test_operator_may_set_owner_references_that_block_deletion() -> None:
    """OwnerReferencesPermissionEnforcement: blockOwnerDeletion on the Jobs and Services the
    operator creates needs `update` on the owner's finalizers, cluster-wide or per namespace."""
    for sets in ((), ("operator.namespaces={team-a}",)):
        roles = [d for d in _docs(*sets) if d["kind"] in {"ClusterRole", "Role"}
                 and d["metadata"]["name"] == "t-gpuplan-operator"]
        granted = {(r, v) for role in roles for rule in role["rules"]
                   if "gpuplan.io" in rule["apiGroups"]
                   for r in rule["resources"] for v in rule["verbs"]}
        assert ("trainingjobs/finalizers", "update") in granted, sets


# Twenty wrong values; each refusal names the value (its path in Helm's schema error).
WRONG_VALUES = [
    ("global=shared", "global"),
    ("global.imagePullSecrets[0]=Not_A_Secret", "/global/imagePullSecrets/0"),
    ("nameOverride=Planner", "/nameOverride"),
    ("fullnameOverride=" + "x" * 51, "/fullnameOverride"),
    ("priorityClassName=High_Priority", "/priorityClassName"),
    ("image.digest=sha256:abc", "/image/digest"),
    ("imagePullSecrets[0]=registry", "/imagePullSecrets/0"),
    ("imagePullSecrets[0].nmae=registry", "nmae"),
    ("affinity.nodeAfinity.x=y", "nodeAfinity"),
    ("affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0]"
     ".labelSelector.matchLabels.a=b", "topologyKey"),
    ("affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight=0",
     "/weight"),
    ("tolerations[0].effect=NoRun", "/tolerations/0/effect"),
    ("tolerations[0].operator=Maybe", "/tolerations/0/operator"),
    ("nodeSelector.pool=1", "/nodeSelector/pool"),
    ("topologySpreadConstraints[0].whenUnsatisfiable=Never", "whenUnsatisfiable"),
    ("topologySpreadConstraints[0].maxSkew=0", "maxSkew"),
    ("estimator.resources.requests.cpu=lots", "/estimator/resources/requests/cpu"),
    ("operator.resources.limitz.memory=1Gi", "limitz"),
    ("scheduler.resources.limits.memory=1Gx", "/scheduler/resources/limits/memory"),
    ("operator.benchmarks.resources.requests.cpu=fast", "/operator/benchmarks/resources"),
]


@pytest.mark.parametrize(("setting", "names"), WRONG_VALUES)
def test_wrong_values_are_refused_naming_the_value(setting: str, names: str) -> None:
    out = render(setting)
    assert out.returncode != 0, setting
    assert names in out.stderr, out.stderr


def test_helm_test_hook_plans_through_the_release_estimator() -> None:
    """templates/tests/plan.yaml: a `helm test` hook running files/test-plan.py against this
    release's estimator Service (tests/integration/test_helm_install.py runs it)."""
    docs = _docs("imagePullSecrets[0].name=registry-a")
    [pod] = [d for d in docs if d["kind"] == "Pod"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["imagePullSecrets"] == [{"name": "registry-a"}]
    [container] = pod["spec"]["containers"]
    assert container["command"][:2] == ["python", "-c"]
    script = container["command"][2]
    assert script == (CHART / "files" / "test-plan.py").read_text()
    compile(script, "test-plan.py", "exec")
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["GPUPLAN_ESTIMATOR_URL"] == "http://t-gpuplan-estimator.ml-infra.svc:8080"
    labels = pod["metadata"]["labels"]
    [policy] = [d for d in docs if d["kind"] == "NetworkPolicy"
                and d["metadata"]["name"] == "t-gpuplan-estimator"]
    admitted = [p["podSelector"]["matchLabels"] for p in policy["spec"]["ingress"][0]["from"]
                if "namespaceSelector" not in p]
    assert labels in admitted
