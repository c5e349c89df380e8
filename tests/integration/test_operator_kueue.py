"""TrainingJobs through a Kueue LocalQueue, with the real Kueue controller on the testbed.

Kueue's CRDs and controller manager (built by hack/testbed-build.sh) run against the testbed's
apiserver; the real operator plans with the real estimator service. The ClusterQueue gives
quota for NVIDIA-L4 only, so a plan that would otherwise pick a faster GPU must stay on L4;
Kueue, not the test, admits the suspended Job, and the pods go through gpuplan-scheduler.
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpuplan_testing import kueue_testbed
from gpuplan_testing import operator_harness as h
from gpuplan_testing.estimator_server import EstimatorServer
from gpuplan_testing.kueue_builders import ClusterQueueBuilder, local_queue, resource_flavor

pytestmark = pytest.mark.slow
G, V = "kueue.x-k8s.io", "v1beta2"
L4 = "NVIDIA-L4"
TYPES = {"l4": L4, "a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3"}


@pytest.fixture(scope="module")
def kueue_log(testbed: Any, kubectl: Any) -> Iterator[pathlib.Path]:
    binary, crds = kueue_testbed.require_kueue()
    kueue_testbed.install_crds(kubectl, crds)
    logs = testbed.logs_dir or pathlib.Path("/tmp")
    with kueue_testbed.run_kueue(binary, testbed.kubeconfig, kubectl, logs) as log:
        yield log


@pytest.fixture
def queues(api_client: Any, namespace: str) -> Iterator[client.CustomObjectsApi]:
    """Flavors for every testbed GPU type (names prefixed by the namespace: they are
    cluster-scoped); ClusterQueue `<ns>` with 8 L4 GPUs, `<ns>-cpu` with no GPU flavor."""
    api = client.CustomObjectsApi(api_client)
    flavors = [resource_flavor(f"{namespace}-{key}", product) for key, product in TYPES.items()]
    flavors.append(resource_flavor(f"{namespace}-cpu"))
    l4 = (ClusterQueueBuilder(namespace).flavor(f"{namespace}-l4", gpus=8)
          .flavor(f"{namespace}-h100", gpus=0).obj())
    cpu_only = ClusterQueueBuilder(f"{namespace}-cpu").flavor(
        f"{namespace}-cpu", gpus=8).obj()
    for obj in [*flavors, l4, cpu_only]:
        plural = "resourceflavors" if obj["kind"] == "ResourceFlavor" else "clusterqueues"
        api.create_cluster_custom_object(G, V, plural, obj, _request_timeout=30)
    for name, cq in (("team", namespace), ("cpu", f"{namespace}-cpu")):
        api.create_namespaced_custom_object(G, V, namespace, "localqueues",
                                            local_queue(name, namespace, cq), _request_timeout=30)
    yield api
    for plural, obj in [("clusterqueues", l4), ("clusterqueues", cpu_only),
                        *(("resourceflavors", f) for f in flavors)]:
        try:
            api.delete_cluster_custom_object(G, V, plural, obj["metadata"]["name"],
                                             _request_timeout=30)
        except client.ApiException as exc:
            if exc.status != 404:
                raise


def queued(name: str, queue: str) -> dict[str, Any]:
    body = h.trainingjob(name, prefer="fastest", max_gpus=8, deadline="24h")
    body["spec"]["kueue"] = {"localQueue": queue}
    return body


def test_queued_trainingjob_is_planned_within_quota_and_admitted_by_kueue(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, testbed: Any, kueue_log: pathlib.Path,
        queues: client.CustomObjectsApi, estimator: EstimatorServer, wait_for: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    wait_for(lambda: _active(queues, namespace), 30, "ClusterQueue Active")
    with h.run_operator(monkeypatch, namespace, estimator.url,
                        SCHEDULER_NAME=testbed.gpuplan_scheduler_name):
        tjs.create(h.trainingjob("free", prefer="fastest", max_gpus=8, deadline="24h"))
        tjs.create(queued("train", "team"))
        tjs.create(queued("nogpu", "cpu"))
        done = wait_for(lambda: tjs.condition("train", "Succeeded"), 120,
                        "queued TrainingJob to succeed\n" + kueue_testbed.tail(kueue_log))
        nofit = wait_for(lambda: tjs.condition("nogpu", "Estimated"), 60,
                         "NoFeasiblePlan for the GPU-less queue")
        tj = tjs.get("train")
        [job] = h.jobs_of(batch_v1, namespace, "train")
    plan, status = tj["status"]["plan"], tj["status"]
    # Only the quota'd type, and no more GPUs than the quota: fastest is all 8 L4 GPUs of the
    # quota, two 4-GPU nodes, so one Indexed Job of two pods.
    assert (plan["gpuType"], plan["gpuCount"], plan["nodes"]) == (L4, 8, 2), plan
    assert (job.spec.completion_mode, job.spec.parallelism) == ("Indexed", 2)
    inventories = sorted([(p["gpu_type"], p["gpus_per_node"], p["nodes"]) for p in r["inventory"]]
                         for r in estimator.requests)
    assert [(L4, 4, 2)] in inventories and len(inventories) == 2  # nogpu asked nothing
    assert f"LocalQueue {namespace}/team (ClusterQueue {namespace})" in _cond(
        status, "Estimated")["message"]
    # The Job was made for Kueue (created suspended: the operator's WaitingForAdmission event
    # comes from the API server's answer to the create) and Kueue let it run.
    assert job.metadata.labels["kueue.x-k8s.io/queue-name"] == "team"
    assert job.spec.suspend is False
    queued_cond = _cond(status, "Queued")
    assert (queued_cond["status"], queued_cond["reason"]) == ("False", "Admitted")
    assert done["reason"] == "JobCompleted"
    [workload] = queues.list_namespaced_custom_object(
        G, V, namespace, "workloads", _request_timeout=30)["items"]
    assert workload["metadata"]["ownerReferences"][0]["name"] == job.metadata.name
    assert _cond(workload["status"], "Admitted")["status"] == "True"
    [podset] = workload["status"]["admission"]["podSetAssignments"]
    assert podset["flavors"]["nvidia.com/gpu"] == f"{namespace}-l4"
    assert podset["count"] == plan["nodes"]  # the whole Indexed Job admitted at once
    assert int(podset["resourceUsage"]["nvidia.com/gpu"]) == plan["gpuCount"]
    events = core_v1.list_namespaced_event(namespace, _request_timeout=30).items
    reasons = {(e.involved_object.name, e.reason) for e in events}
    assert ("train", "WaitingForAdmission") in reasons and ("train", "Admitted") in reasons
    # Pods went through gpuplan-scheduler onto kwok L4 nodes.
    pods = core_v1.list_namespaced_pod(namespace, label_selector="gpuplan.io/trainingjob=train",
                                       _request_timeout=30).items
    assert len(pods) == plan["nodes"]
    assert all(p.spec.scheduler_name == testbed.gpuplan_scheduler_name for p in pods)
    assert all(p.spec.node_name.startswith("l4-") for p in pods)
    assert all(p.spec.node_selector == {"nvidia.com/gpu.product": L4} for p in pods)
    scheduled = [e for e in events if e.reason == "Scheduled"
                 and e.involved_object.name in {p.metadata.name for p in pods}]
    assert scheduled and all(
        (e.reporting_component or e.source.component) == testbed.gpuplan_scheduler_name
        for e in scheduled)
    # Without a queue the same model takes the fastest type and no suspend.
    free = tjs.get("free")["status"]
    [free_job] = h.jobs_of(batch_v1, namespace, "free")
    assert not free_job.spec.suspend and "Queued" not in {
        c["type"] for c in free["conditions"]}
    assert free["plan"]["gpuType"] != L4, free["plan"]
    # A queue with no GPU flavor: NoFeasiblePlan naming it, no Job.
    assert (nofit["status"], nofit["reason"]) == ("False", "NoFeasiblePlan")
    assert nofit["message"].startswith(
        f"LocalQueue {namespace}/cpu (ClusterQueue {namespace}-cpu) has no nvidia.com/gpu quota")
    assert "no nvidia.com/gpu.product in nodeLabels" in nofit["message"]
    assert not h.jobs_of(batch_v1, namespace, "nogpu")


def _active(api: client.CustomObjectsApi, name: str) -> bool:
    cq = api.get_cluster_custom_object(G, V, "clusterqueues", name, _request_timeout=30)
    return _cond(cq.get("status") or {}, "Active").get("status") == "True"


def _cond(status: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in status.get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}
