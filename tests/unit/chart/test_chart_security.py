"""Secure defaults of the chart (#16): the restricted Pod Security profile on every pod the chart
renders and the operator creates, least-privilege RBAC, NetworkPolicy, tenant roles, PDBs."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
import yaml

from gpuplan_operator import benchmark_loop
from gpuplan_operator.core import benchmarks, retraining, settings
from gpuplan_testing import pod_security
from gpuplan_testing.helm_render import render

NAMESPACED = ("operator.namespaces={team-a,team-b}",)
VARIANTS = {
    "default": (),
    "namespaced": NAMESPACED,
    # A PVC goes with one replica and no database URL (#33), so it is a variant of its own.
    "ha": ("estimator.replicas=2", "estimator.database.urlSecret=perfdb", "scheduler.replicas=2",
           "kueue.enabled=true"),
    "persistent": ("estimator.persistence.enabled=true",),
}


def _docs(*sets: str, namespace: str = "gpuplan-system") -> list[dict[str, Any]]:
    out = render(*sets, namespace=namespace)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {f"{d['metadata'].get('namespace', '')}/{d['metadata']['name']}": d
            for d in docs if d["kind"] == kind}


def _rules(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


# -- Pod Security ----------------------------------------------------------------------------


def test_the_checker_flags_what_the_restricted_profile_forbids() -> None:
    """The checker can fail: the pod spec the chart rendered before #16 broke three controls."""
    old = {"securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
           "containers": [{"name": "c", "securityContext": {"capabilities": {"drop": ["ALL"]}}}],
           "volumes": [{"name": "h", "hostPath": {"path": "/"}}]}
    found = pod_security.violations(old)
    assert [v.split(":")[0] for v in found] == [
        "HostPath Volumes", "Volume Types", "Privilege Escalation", "Seccomp"]


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_rendered_pod_meets_the_restricted_profile(variant: str) -> None:
    pods = pod_security.pod_specs(_docs(*VARIANTS[variant]))
    assert set(pods) == {"Deployment/t-gpuplan-estimator", "Deployment/t-gpuplan-operator",
                         "Deployment/t-gpuplan-scheduler", "Pod/t-gpuplan-test-plan"}
    assert {name: pod_security.violations(pod) for name, pod in pods.items()} == {
        name: [] for name in pods}
    for name, pod in pods.items():
        for container in pod["containers"]:
            assert container["securityContext"]["readOnlyRootFilesystem"] is True, name
        # Writable paths are emptyDirs (or the estimator's data volume), never the image; the
        # `helm test` pod writes nothing.
        if name.startswith("Deployment/"):
            assert {"name": "tmp", "emptyDir": {}} in pod["volumes"], name


def test_jobs_the_operator_creates_meet_the_restricted_profile() -> None:
    env = {"GPUPLAN_ESTIMATOR_URL": "http://e:8080", "GPUPLAN_BENCHMARKS_ENABLED": "true",
           "GPUPLAN_BENCHMARK_IMAGE": "bench:1", "GPUPLAN_BENCHMARK_DB_SECRET": "perfdb",
           "GPUPLAN_BENCHMARK_NAMESPACE": "gpuplan-system", "GPUPLAN_RETRAINING_ENABLED": "true",
           "GPUPLAN_RETRAINING_IMAGE": "gpuplan:1"}
    cfg = settings.Settings.from_env(env).validate()
    now = datetime.datetime.now(datetime.UTC)
    bench = benchmarks.build_job("NVIDIA-A100-SXM4-80GB", now=now, namespace="gpuplan-system",
                                 options=benchmark_loop.job_options(cfg))
    train = retraining.build_job(retraining.Trigger("schedule", "1"), namespace="gpuplan-system",
                                 options=benchmark_loop.retraining_options(cfg))
    for job in (bench, train):
        pod = job["spec"]["template"]["spec"]
        assert pod_security.violations(pod) == []
        assert pod["automountServiceAccountToken"] is False  # they never call the API server


# -- RBAC ------------------------------------------------------------------------------------


def test_components_run_as_their_own_service_accounts() -> None:
    docs = _docs()
    pods = {name: pod for name, pod in pod_security.pod_specs(docs).items()
            if name.startswith("Deployment/")}
    # The `helm test` pod calls only the estimator: no account of its own, no token.
    assert pod_security.pod_specs(docs)["Pod/t-gpuplan-test-plan"][
        "automountServiceAccountToken"] is False
    accounts = {name: pod["serviceAccountName"] for name, pod in pods.items()}
    assert accounts == {"Deployment/t-gpuplan-estimator": "t-gpuplan-estimator",
                        "Deployment/t-gpuplan-operator": "t-gpuplan-operator",
                        "Deployment/t-gpuplan-scheduler": "t-gpuplan-scheduler"}
    sas = _by_kind(docs, "ServiceAccount")
    assert sorted(sas) == ["/t-gpuplan-estimator", "/t-gpuplan-operator", "/t-gpuplan-scheduler"]
    # No token unless a pod spec asks for one; all three call the API server and do.
    assert all(sa["automountServiceAccountToken"] is False for sa in sas.values())
    assert all(pod["automountServiceAccountToken"] is True for pod in pods.values())


def test_estimator_may_only_create_tokenreviews() -> None:
    docs = _docs()
    role = _by_kind(docs, "ClusterRole")["/t-gpuplan-estimator"]
    assert _rules(role) == {("authentication.k8s.io", "tokenreviews", "create")}
    binding = _by_kind(docs, "ClusterRoleBinding")["/t-gpuplan-estimator"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "t-gpuplan-estimator",
                                    "namespace": "gpuplan-system"}]


def test_cluster_wide_operator_reads_configmaps_and_never_deletes() -> None:
    rules = _rules(_by_kind(_docs(), "ClusterRole")["/t-gpuplan-operator"])
    assert {v for g, r, v in rules if r == "configmaps"} == {"get"}
    assert {v for g, r, v in rules if r == "serviceaccounts"} == {"get"}
    assert {v for g, r, v in rules if r == "jobs"} == {"get", "list", "watch", "create"}
    # `update` only on trainingjobs/finalizers: what blockOwnerDeletion on its Jobs needs
    # (OwnerReferencesPermissionEnforcement); it changes no object.
    assert not {(r, v) for g, r, v in rules if v in {"delete", "deletecollection", "update", "*"}
                } - {("trainingjobs/finalizers", "update")}
    assert ("kopf.dev", "clusterkopfpeerings", "patch") in rules


def test_namespaced_operator_holds_tenant_rights_only_in_its_namespaces() -> None:
    docs = _docs(*NAMESPACED)
    cluster = _rules(_by_kind(docs, "ClusterRole")["/t-gpuplan-operator"])
    # Cluster-wide it only reads the GPU nodes and what kopf discovers; pods only in its own
    # namespaces (#33).
    assert {r for _, r, _ in cluster} == {"nodes", "customresourcedefinitions", "namespaces"}
    assert {v for _, _, v in cluster} <= {"get", "list", "watch"}
    roles = _by_kind(docs, "Role")
    bindings = _by_kind(docs, "RoleBinding")
    for ns in ("team-a", "team-b"):
        rules = _rules(roles[f"{ns}/t-gpuplan-operator"])
        assert ("batch", "jobs", "create") in rules and ("", "configmaps", "get") in rules
        assert ("kopf.dev", "kopfpeerings", "patch") in rules
        assert ("", "pods", "list") in rules
        assert bindings[f"{ns}/t-gpuplan-operator"]["subjects"][0]["name"] == "t-gpuplan-operator"
    # Benchmark and retraining Jobs run in the release's namespace.
    jobs = _rules(roles["gpuplan-system/t-gpuplan-operator-jobs"])
    assert jobs == {("batch", "jobs", v) for v in ("get", "list", "watch", "create")}


def test_the_operator_may_hold_only_its_own_lease() -> None:
    docs = _docs()
    lease = _by_kind(docs, "Role")["gpuplan-system/t-gpuplan-operator-lease"]
    assert _rules(lease) == {("coordination.k8s.io", "leases", v)
                             for v in ("get", "update", "create")}
    named = [r for r in lease["rules"] if "get" in r["verbs"]]
    assert named[0]["resourceNames"] == ["t-gpuplan-operator"]


def test_operator_peers_through_a_peering_object_per_scope() -> None:
    default = _docs()
    [cluster_peering] = [d for d in default if d["kind"] == "ClusterKopfPeering"]
    assert cluster_peering["metadata"]["name"] == "t-gpuplan-operator"
    peerings = {(d["metadata"]["namespace"], d["metadata"]["name"])
                for d in _docs(*NAMESPACED) if d["kind"] == "KopfPeering"}
    assert peerings == {("team-a", "t-gpuplan-operator"), ("team-b", "t-gpuplan-operator")}


def test_glob_namespaces_are_refused() -> None:
    out = render("operator.namespaces={team-*}")
    assert out.returncode != 0 and "namespaces" in out.stderr


# -- NetworkPolicy ---------------------------------------------------------------------------


def test_only_operator_scheduler_helm_test_and_prometheus_reach_the_estimator() -> None:
    policies = _by_kind(_docs(), "NetworkPolicy")
    estimator = policies["/t-gpuplan-estimator"]["spec"]
    assert estimator["policyTypes"] == ["Ingress"]  # egress left open (docs/security.md)
    [rule, metrics] = estimator["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    components = [p["podSelector"]["matchLabels"].get("app.kubernetes.io/component")
                  for p in rule["from"] if "namespaceSelector" not in p]
    assert components == ["operator", "scheduler", "helm-test"]
    assert not [p for p in rule["from"] if "namespaceSelector" in p]  # #33: metrics moved
    assert metrics["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    prometheus = metrics["from"]
    assert prometheus == [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}},
        "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]


def test_metrics_ports_only_from_the_configured_prometheus() -> None:
    policies = _by_kind(_docs("networkPolicy.prometheus.namespaceSelector.matchLabels.team=obs",
                              "networkPolicy.prometheus.podSelector=null"), "NetworkPolicy")
    peer = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring",
                                                    "team": "obs"}}}]
    for name, ports in (("operator", ["metrics"]), ("scheduler", ["metrics", "https"])):
        [rule] = policies[f"/t-gpuplan-{name}"]["spec"]["ingress"]
        assert [p["port"] for p in rule["ports"]] == ports
        assert rule["from"] == peer
    assert _by_kind(_docs("networkPolicy.enabled=false"), "NetworkPolicy") == {}


# -- Tenant roles, PDBs, estimator replicas -------------------------------------------------------


def test_tenant_roles_aggregate_into_edit_and_view() -> None:
    roles = _by_kind(_docs(), "ClusterRole")
    edit, view = roles["/t-gpuplan-edit"], roles["/t-gpuplan-view"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-admin"] == "true"
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert ("gpuplan.io", "trainingjobs", "create") in _rules(edit)
    assert {v for _, _, v in _rules(view)} == {"get", "list", "watch"}
    assert not {"/t-gpuplan-edit", "/t-gpuplan-view"} & set(
        _by_kind(_docs("tenantRoles.enabled=false"), "ClusterRole"))


@pytest.mark.parametrize(("sets", "expected"), [
    ((), {"operator"}),  # two peering operator replicas by default
    (("operator.replicas=1",), set()),
    (("operator.replicas=1", "estimator.replicas=3", "estimator.database.urlSecret=pg",
      "scheduler.replicas=2"), {"estimator", "scheduler"}),
])
def test_a_pdb_for_each_component_with_more_than_one_replica(
        sets: tuple[str, ...], expected: set[str]) -> None:
    pdbs = _by_kind(_docs(*sets), "PodDisruptionBudget").values()
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in pdbs} == expected
    for pdb in pdbs:
        assert pdb["spec"]["maxUnavailable"] == 1
        component = pdb["metadata"]["labels"]["app.kubernetes.io/component"]
        assert pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"] == component


def test_estimator_replicas_need_a_database_in_the_schema() -> None:
    out = render("estimator.replicas=2")
    assert out.returncode != 0 and "urlSecret" in out.stderr
    assert render("estimator.replicas=2", "estimator.database.urlSecret=pg").returncode == 0
