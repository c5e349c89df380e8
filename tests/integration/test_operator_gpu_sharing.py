"""Issue #32 on the testbed: shared and partitioned GPUs as they are, other schedulers, gangs
and quotas, with the real operator, estimator, kube-scheduler and gpuplan-scheduler.

The test adds kwok nodes with each labelling GPU Feature Discovery writes: MIG `single`
(the product names the profile, `nvidia.com/gpu` counts instances), MIG `mixed` (the product
names the board, each profile is a resource of its own) and time-slicing (`gpu.replicas`, the
product suffixed -SHARED). They are tainted for the test's namespace, whose pods tolerate it.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuplan_operator.core import gangs
from gpuplan_testing import operator_harness as h
from gpuplan_testing.estimator_server import EstimatorServer

pytestmark = pytest.mark.slow
A100, H100 = "NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"
MIG_SINGLE, MIG_MIXED = f"{A100}-MIG-1g.10gb", f"{H100}-MIG-3g.40gb"
PODGROUP_CRD = (pathlib.Path(__file__).parents[1] / "fixtures" / "podgroups"
                / "volcano-podgroup-crd.yaml")
TAINT_KEY = "gpuplan.io/test"


def kwok_node(name: str, namespace: str, labels: dict[str, str],
              allocatable: dict[str, str]) -> dict[str, Any]:
    import testbed_render

    [node] = testbed_render.node_manifests({"kind": "NodePools", "pools": [
        {"namePrefix": name, "count": 1, "cpu": "64", "memory": "512Gi"}]}, name)
    node["metadata"]["labels"].update(labels)
    resources = {**node["status"]["allocatable"], **allocatable}
    node["status"] = {"capacity": dict(resources), "allocatable": dict(resources)}
    node["spec"] = {"taints": [{"key": TAINT_KEY, "value": namespace, "effect": "NoSchedule"}]}
    return node


@pytest.fixture
def shared_nodes(core_v1: Any, namespace: str, wait_for: Any) -> Iterator[dict[str, str]]:
    """One MIG-single, one MIG-mixed and one time-sliced node; yields their names by kind."""
    nodes = {
        "single": kwok_node("gs-mig-single", namespace, {
            "nvidia.com/gpu.product": MIG_SINGLE, "nvidia.com/gpu.count": "14",
            "nvidia.com/mig.strategy": "single"}, {"nvidia.com/gpu": "14"}),
        "mixed": kwok_node("gs-mig-mixed", namespace, {
            "nvidia.com/gpu.product": H100, "nvidia.com/gpu.count": "2",
            "nvidia.com/mig.strategy": "mixed"}, {"nvidia.com/mig-3g.40gb": "4"}),
        "sliced": kwok_node("gs-sliced", namespace, {
            "nvidia.com/gpu.product": "NVIDIA-L40S-SHARED", "nvidia.com/gpu.count": "2",
            "nvidia.com/gpu.replicas": "4"}, {"nvidia.com/gpu": "8"}),
    }
    for node in nodes.values():
        core_v1.create_node(node, _request_timeout=30)
    names = {kind: node["metadata"]["name"] for kind, node in nodes.items()}
    try:
        for name in names.values():
            wait_for(lambda n=name: _ready(core_v1, n), 30, f"node {name} Ready")
        yield names
    finally:
        for name in names.values():
            core_v1.delete_node(name, _request_timeout=30)


def _ready(core_v1: Any, name: str) -> bool:
    node = core_v1.read_node(name, _request_timeout=30)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def tolerating(body: dict[str, Any], namespace: str) -> dict[str, Any]:
    body["spec"]["template"]["spec"]["tolerations"] = [
        {"key": TAINT_KEY, "operator": "Equal", "value": namespace, "effect": "NoSchedule"}]
    return body


def _pods(core_v1: Any, namespace: str, tj: str) -> list[Any]:
    return list(core_v1.list_namespaced_pod(
        namespace, label_selector=f"gpuplan.io/trainingjob={tj}", _request_timeout=30).items)


def test_mig_and_time_sliced_nodes_are_planned_as_they_are(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any,
        shared_nodes: dict[str, str]) -> None:
    h.create_model_configmap(core_v1, namespace)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(tolerating(h.trainingjob("single", prefer="fastest", max_gpus=4,
                                            gpu_types=[MIG_SINGLE]), namespace))
        tjs.create(tolerating(h.trainingjob("mixed", prefer="fastest", max_gpus=2,
                                            gpu_types=[MIG_MIXED]), namespace))
        tjs.create(tolerating(h.trainingjob("sliced", gpu_types=["NVIDIA-L40S"]), namespace))
        for name in ("single", "mixed"):
            wait_for(lambda n=name: tjs.condition(n, "Succeeded"), 120, f"{name} to succeed")
        refused = wait_for(lambda: _false(tjs.condition("sliced", "Estimated")), 60,
                           "sliced to find no plan")
        pods = {name: _pods(core_v1, namespace, name) for name in ("single", "mixed")}
        jobs = {name: h.jobs_of(batch_v1, namespace, name)[0] for name in ("single", "mixed")}
    inventory = {p["gpu_type"]: p for p in estimator.requests[0]["inventory"]}
    # MIG instances are a pool of their own, one per pod; the time-sliced node is no pool
    assert inventory[MIG_SINGLE] == {"gpu_type": MIG_SINGLE, "gpus_per_node": 1, "nodes": 14,
                                     "free_gpus": 14}
    assert inventory[MIG_MIXED]["nodes"] == 4 and inventory[MIG_MIXED]["gpus_per_node"] == 1
    assert not [t for t in inventory if "L40S" in t]
    for name, gpu_type, resource, node in (
            ("single", MIG_SINGLE, "nvidia.com/gpu", shared_nodes["single"]),
            ("mixed", MIG_MIXED, "nvidia.com/mig-3g.40gb", shared_nodes["mixed"])):
        plan = tjs.get(name)["status"]["plan"]
        assert plan["gpuType"] == gpu_type and plan["device"].endswith(
            gpu_type.split("-MIG-")[1])
        assert plan["gpusPerNode"] == 1 and plan["gpuCount"] == plan["nodes"] >= 1
        assert jobs[name].spec.parallelism == plan["nodes"]
        limits = jobs[name].spec.template.spec.containers[0].resources.limits
        assert limits == {resource: "1"}
        assert len(pods[name]) == plan["nodes"]
        assert {p.spec.node_name for p in pods[name]} == {node}
    # mixed MIG pods keep the default scheduler: the extender reads whole-GPU labels only
    assert {p.spec.scheduler_name for p in pods["mixed"]} == {"default-scheduler"}
    assert refused["reason"] == "NoFeasiblePlan"
    assert f"{shared_nodes['sliced']} (time-slicing or MPS: 4 replicas of 2 GPU(s)" in (
        refused["message"])


def _false(condition: dict[str, Any] | None) -> dict[str, Any] | None:
    return condition if condition is not None and condition["status"] == "False" else None


def test_a_tenant_scheduler_is_kept_and_gpuplan_scheduler_is_opt_in(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any, testbed: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    tenant = h.trainingjob("tenant", gpu_types=["NVIDIA-L4"])
    tenant["spec"]["template"]["spec"]["schedulerName"] = "tenant-scheduler"
    with h.run_operator(monkeypatch, namespace, estimator.url, SCHEDULER_SCOPE="opt-in",
                        SCHEDULER_NAME=testbed.gpuplan_scheduler_name):
        tjs.create(tenant)
        tjs.create(h.trainingjob("plain", gpu_types=["NVIDIA-L4"]))
        for name in ("tenant", "plain"):
            wait_for(lambda n=name: tjs.condition(n, "Launched"), 60, f"{name} launched")
        core_v1.patch_namespace(namespace, {"metadata": {"labels": {
            gangs.SCHEDULER_OPT_IN_LABEL: gangs.SCHEDULER_OPT_IN_VALUE}}}, _request_timeout=30)
        tjs.create(h.trainingjob("opted", gpu_types=["NVIDIA-L4"]))
        wait_for(lambda: tjs.condition("opted", "Succeeded"), 90, "opted to succeed")
        wait_for(lambda: tjs.condition("plain", "Succeeded"), 90, "plain to succeed")
        chosen = {name: h.jobs_of(batch_v1, namespace, name)[0].spec.template.spec.scheduler_name
                  for name in ("tenant", "plain", "opted")}
        tenant_pods = _pods(core_v1, namespace, "tenant")
    assert chosen == {"tenant": "tenant-scheduler", "plain": "default-scheduler",
                      "opted": testbed.gpuplan_scheduler_name}
    # no tenant-scheduler runs here: its pod waits for it, unbound, as it would for KAI
    assert tenant_pods and all(not p.spec.node_name for p in tenant_pods)


@pytest.fixture
def volcano_podgroups(kubectl: Any) -> Iterator[None]:
    """Volcano's PodGroup API served (its CRD alone), for this test only."""
    kubectl("apply", "-f", str(PODGROUP_CRD))
    kubectl("wait", "--for=condition=Established", "crd/podgroups.scheduling.volcano.sh",
            "--timeout=60s")
    try:
        yield
    finally:
        kubectl("delete", "-f", str(PODGROUP_CRD), "--wait=false")


def test_a_multi_node_plan_is_a_gang_through_a_podgroup(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any, api_client: Any,
        volcano_podgroups: None) -> None:
    h.create_model_configmap(core_v1, namespace)
    groups = client.CustomObjectsApi(api_client)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(h.trainingjob("gang", prefer="fastest", max_gpus=16, gpu_types=[A100]))
        wait_for(lambda: tjs.condition("gang", "Launched"), 60, "gang launched")
        group = groups.get_namespaced_custom_object(
            "scheduling.volcano.sh", "v1beta1", namespace, "podgroups", "gang-train",
            _request_timeout=30)
        [job] = h.jobs_of(batch_v1, namespace, "gang")
        wait_for(lambda: len(_pods(core_v1, namespace, "gang")) == 2, 60, "gang's pods")
        pods = _pods(core_v1, namespace, "gang")
    tj = tjs.get("gang")
    assert tj["status"]["plan"]["nodes"] == 2
    assert group["spec"] == {"minMember": 2, "queue": "default"}
    assert group["metadata"]["ownerReferences"][0]["uid"] == tj["metadata"]["uid"]
    assert job.spec.template.metadata.annotations["scheduling.k8s.io/group-name"] == "gang-train"
    assert all(p.metadata.annotations["scheduling.k8s.io/group-name"] == "gang-train"
               for p in pods)


def test_a_plan_is_capped_by_the_namespace_quota_and_refused_pods_are_a_condition(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    core_v1.create_namespaced_resource_quota(namespace, {
        "metadata": {"name": "gpus"}, "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}},
        _request_timeout=30)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(h.trainingjob("capped", prefer="fastest", max_gpus=16, gpu_types=[A100]))
        wait_for(lambda: tjs.condition("capped", "Succeeded"), 90, "capped to succeed")
        # Pods the API server refuses (a quota the plan does not read): not "Launched"
        core_v1.create_namespaced_resource_quota(namespace, {
            "metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}},
            _request_timeout=30)
        wait_for(lambda: _quota_counted(core_v1, namespace), 30, "pods quota counted")
        tjs.create(h.trainingjob("refused", gpu_types=["NVIDIA-L4"]))
        launched = wait_for(lambda: _false(tjs.condition("refused", "Launched")), 60,
                            "refused pods as a condition")
    tj = tjs.get("capped")
    plan = tj["status"]["plan"]
    assert plan["gpuCount"] <= 4, plan
    estimated = next(c for c in tj["status"]["conditions"] if c["type"] == "Estimated")
    assert "capped at 4 GPU(s): ResourceQuota gpus leaves 4 requests.nvidia.com/gpu" in (
        estimated["message"])
    assert estimator.requests[0]["objective"]["max_gpus"] == 4
    assert launched["reason"] == "PodsNotCreated"
    assert "exceeded quota: no-pods" in launched["message"]


def _quota_counted(core_v1: Any, namespace: str) -> bool:
    quota = core_v1.read_namespaced_resource_quota("no-pods", namespace, _request_timeout=30)
    return bool(quota.status and quota.status.hard)
