"""Smoke tests of the local testbed: real schedulers, kwok pod lifecycles, kubectl and helm."""

from __future__ import annotations

import collections
import pathlib
import subprocess
from typing import Any

import pytest
import yaml
from testbed_pytest import Kubectl, Testbed, is_ci

pytestmark = pytest.mark.integration

ROOT = pathlib.Path(__file__).resolve().parents[2]
L4 = "NVIDIA-L4"
TIMEOUT_S = 60.0


def gpu_pod_spec(gpus: int, product: str | None = None, scheduler: str | None = None,
                 restart: str = "Never") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": restart,
        "containers": [{"name": "main", "image": "busybox:1.36",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }
    if product is not None:
        term = {"matchExpressions": [
            {"key": "nvidia.com/gpu.product", "operator": "In", "values": [product]}]}
        spec["affinity"] = {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return spec


def job(name: str, pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name},
            "spec": {"backoffLimit": 0, "template": {"spec": pod_spec}}}


def job_pods(core_v1: Any, ns: str, job_name: str) -> list[Any]:
    return list(core_v1.list_namespaced_pod(ns, label_selector=f"job-name={job_name}").items)


def pod_events(core_v1: Any, ns: str, pod_name: str) -> list[Any]:
    selector = f"involvedObject.kind=Pod,involvedObject.name={pod_name}"
    return list(core_v1.list_namespaced_event(ns, field_selector=selector).items)


def test_fake_nodes_match_nodes_yaml(core_v1: Any) -> None:
    doc = yaml.safe_load((ROOT / "testbed" / "nodes.yaml").read_text())
    want = collections.Counter({p["gpu"]["product"] if "gpu" in p else "": p["count"]
                                for p in doc["pools"]})
    nodes = core_v1.list_node(label_selector="gpuplan.io/testbed-node=true").items
    got = collections.Counter(n.metadata.labels.get("nvidia.com/gpu.product", "") for n in nodes)
    assert got == want
    h100 = next(n for n in nodes if n.metadata.labels.get("nvidia.com/gpu.product")
                == "NVIDIA-H100-80GB-HBM3")
    assert h100.status.allocatable["nvidia.com/gpu"] == "8"
    assert h100.metadata.labels["nvidia.com/gpu.memory"] == "81559"
    assert not h100.spec.taints, "kwok nodes must stay untainted (no not-ready taint)"


def test_gpu_job_lands_on_l4_and_succeeds(namespace: str, core_v1: Any, batch_v1: Any,
                                          wait_for: Any) -> None:
    batch_v1.create_namespaced_job(namespace, job("l4-job", gpu_pod_spec(2, product=L4)))

    pod = wait_for(lambda: next((p for p in job_pods(core_v1, namespace, "l4-job")
                                 if p.spec.node_name), None), TIMEOUT_S, "l4-job pod bound")
    node = core_v1.read_node(pod.spec.node_name)
    assert node.metadata.labels["nvidia.com/gpu.product"] == L4
    scheduled = [e for e in pod_events(core_v1, namespace, pod.metadata.name)
                 if e.reason == "Scheduled"]
    assert scheduled and (scheduled[0].reporting_component or scheduled[0].source.component) \
        == "default-scheduler"

    done = wait_for(lambda: batch_v1.read_namespaced_job(
        "l4-job", namespace).status.succeeded, TIMEOUT_S, "l4-job succeeded")
    assert done == 1
    assert core_v1.read_namespaced_pod(pod.metadata.name, namespace).status.phase == "Succeeded"


def test_job_larger_than_any_node_stays_pending(namespace: str, core_v1: Any, batch_v1: Any,
                                                wait_for: Any) -> None:
    batch_v1.create_namespaced_job(namespace, job("too-big", gpu_pod_spec(16)))
    pod = wait_for(lambda: next(iter(job_pods(core_v1, namespace, "too-big")), None),
                   TIMEOUT_S, "too-big pod created by the job controller")

    failed = wait_for(lambda: [e for e in pod_events(core_v1, namespace, pod.metadata.name)
                               if e.reason == "FailedScheduling"],
                      TIMEOUT_S, "FailedScheduling event")
    assert "Insufficient nvidia.com/gpu" in failed[0].message
    pod = core_v1.read_namespaced_pod(pod.metadata.name, namespace)
    assert pod.status.phase == "Pending" and pod.spec.node_name is None


def test_second_scheduler_schedules_its_pods(testbed: Testbed, namespace: str, core_v1: Any,
                                             wait_for: Any) -> None:
    name = testbed.gpuplan_scheduler_name
    body = {"metadata": {"name": "via-gpuplan",
                         "annotations": {"testbed.io/succeed-after": "1s"}},
            "spec": gpu_pod_spec(1, product=L4, scheduler=name)}
    core_v1.create_namespaced_pod(namespace, body)

    def scheduled_by() -> str | None:
        events = [e for e in pod_events(core_v1, namespace, "via-gpuplan")
                  if e.reason == "Scheduled"]
        return (events[0].reporting_component or events[0].source.component) if events else None

    assert wait_for(scheduled_by, TIMEOUT_S, f"Scheduled event of via-gpuplan\n"
                    f"{testbed.log_tail(name)}") == name
    phase = wait_for(lambda: core_v1.read_namespaced_pod("via-gpuplan", namespace).status.phase
                     in ("Succeeded", "Failed") and
                     core_v1.read_namespaced_pod("via-gpuplan", namespace).status.phase,
                     TIMEOUT_S, "via-gpuplan finished (testbed.io/succeed-after)")
    assert phase == "Succeeded"


def test_fail_after_annotation_fails_the_pod(namespace: str, core_v1: Any, wait_for: Any) -> None:
    body = {"metadata": {"name": "doomed", "annotations": {"testbed.io/fail-after": "1s"}},
            "spec": gpu_pod_spec(1, product=L4)}
    core_v1.create_namespaced_pod(namespace, body)
    pod = wait_for(lambda: (p := core_v1.read_namespaced_pod("doomed", namespace)).status.phase
                   == "Failed" and p, TIMEOUT_S, "doomed pod Failed")
    terminated = pod.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 1 and terminated.reason == "Error"


def test_kubectl_apply_get_and_server_dry_run(kubectl: Kubectl, namespace: str) -> None:
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "real"},
          "data": {"k": "v"}}
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(cm))
    assert kubectl.json("get", "configmap", "real", "-n", namespace)["data"] == {"k": "v"}

    dry = dict(cm, metadata={"name": "dry"})
    out = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                  input=yaml.safe_dump(dry))
    assert "(server dry run)" in out.stdout
    assert kubectl("get", "configmap", "dry", "-n", namespace, check=False).returncode != 0

    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "bad"},
           "spec": {"containers": [{"name": "c"}]}}
    rejected = kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                       input=yaml.safe_dump(bad), check=False)
    assert rejected.returncode != 0 and "spec.containers[0].image" in rejected.stderr


def charts() -> list[pathlib.Path]:
    found = [ROOT / "tests" / "fixtures" / "charts" / "tiny"]
    if (ROOT / "charts" / "gpuplan" / "Chart.yaml").is_file():
        found.append(ROOT / "charts" / "gpuplan")
    return found


@pytest.mark.parametrize("chart", charts(), ids=lambda p: p.name)
def test_helm_template_applies_with_server_dry_run(testbed: Testbed, kubectl: Kubectl,
                                                   namespace: str, chart: pathlib.Path) -> None:
    if testbed.helm_path is None:
        message = "helm binary missing; run `make testbed-build`"
        if is_ci():
            pytest.fail(message)
        pytest.skip(message)
    rendered = subprocess.run(
        [str(testbed.helm_path), "template", "smoke", str(chart), "--namespace", namespace],
        capture_output=True, text=True, timeout=60)
    assert rendered.returncode == 0, rendered.stderr
    assert rendered.stdout.strip(), f"helm rendered nothing for {chart}"
    # Objects the chart pins to another namespace (the scheduler's kube-system RoleBinding)
    # are applied in theirs: kubectl refuses a -n that contradicts the object.
    by_namespace: dict[str, list[Any]] = {}
    for doc in yaml.safe_load_all(rendered.stdout):
        if doc:
            pinned = (doc.get("metadata") or {}).get("namespace") or namespace
            by_namespace.setdefault(pinned, []).append(doc)
    for target, docs in sorted(by_namespace.items()):
        out = kubectl("apply", "--dry-run=server", "-n", target, "-f", "-",
                      input=yaml.safe_dump_all(docs))
        assert "(server dry run)" in out.stdout
