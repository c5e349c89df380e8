"""Pure inventory from Nodes/Pods and Job outcome extraction."""

from __future__ import annotations

from typing import Any

from gpuplan_operator.core import gpu_pools, tracking


def node(name: str, product: str | None, gpus: str, *, ready: bool = True,
         unschedulable: bool = False) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.product": product} if product else {}
    return {"metadata": {"name": name, "labels": labels},
            "spec": {"unschedulable": unschedulable},
            "status": {"allocatable": {"nvidia.com/gpu": gpus},
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}}


def pod(node_name: str | None, gpus: str, phase: str = "Running") -> dict[str, Any]:
    return {"spec": {"nodeName": node_name, "containers": [
        {"resources": {"limits": {"nvidia.com/gpu": gpus}}}, {"resources": {}}]},
        "status": {"phase": phase}}


def test_inventory_groups_by_product_and_subtracts_active_requests() -> None:
    nodes = [node("a0", "A100", "8"), node("a1", "A100", "8"), node("l0", "L4", "4"),
             node("cpu", None, "0"), node("bad", "A100", "8", ready=False),
             node("cordoned", "L4", "4", unschedulable=True)]
    pods = [pod("a0", "3"), pod("a0", "8", phase="Succeeded"), pod("l0", "4"), pod(None, "2")]
    assert gpu_pools.build_inventory(nodes, pods) == [
        gpu_pools.ClusterGpuPool("A100", gpus_per_node=8, nodes=2, free_gpus=13),
        gpu_pools.ClusterGpuPool("L4", gpus_per_node=4, nodes=1, free_gpus=0),
    ]


def test_a_node_with_a_malformed_gpu_count_is_left_out() -> None:
    nodes = [{"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "L4"}},
              "status": {"allocatable": {"nvidia.com/gpu": "1k"},
                         "conditions": [{"type": "Ready", "status": "True"}]}}]
    assert gpu_pools.build_inventory(nodes, []) == []


def job(conditions: list[dict[str, Any]], **status: Any) -> dict[str, Any]:
    return {"status": {"conditions": conditions, **status}}


def test_running_job_has_no_outcome() -> None:
    assert tracking.job_outcome(job([], startTime="2026-01-01T00:00:00Z")) is None


def test_completed_job() -> None:
    out = tracking.job_outcome(job([{"type": "Complete", "status": "True"}],
                                   startTime="2026-01-01T00:00:00Z",
                                   completionTime="2026-01-01T00:01:30Z", succeeded=1))
    assert out is not None and out.succeeded and out.actual.seconds == 90


def test_failed_job_ends_at_the_failed_condition() -> None:
    out = tracking.job_outcome(job([{"type": "Failed", "status": "True", "reason": "BackoffLimit",
                                     "lastTransitionTime": "2026-01-01T00:00:10Z"}],
                                   startTime="2026-01-01T00:00:00Z"))
    assert out is not None and not out.succeeded and out.actual.seconds == 10
    assert "BackoffLimit" in out.message


def _container(state: dict[str, Any], last: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": "trainer", "state": state, "lastState": last or {}}


DONE = job([{"type": "Complete", "status": "True"}], startTime="2026-01-01T00:00:00Z",
           completionTime="2026-01-01T00:10:00Z")


def test_run_is_measured_from_the_first_container_start_of_any_pod() -> None:
    pods = [
        {"status": {"startTime": "2026-01-01T00:01:00Z", "containerStatuses": [
            _container({"terminated": {"startedAt": "2026-01-01T00:05:00Z"}},
                       {"terminated": {"startedAt": "2026-01-01T00:03:00Z"}})],
                    "initContainerStatuses": [
            _container({"terminated": {"startedAt": "2026-01-01T00:01:30Z"}})]}},
        {"status": {"startTime": "2026-01-01T00:02:00Z", "containerStatuses": [
            _container({"running": {"startedAt": "2026-01-01T00:04:00Z"}})]}},
    ]
    out = tracking.job_outcome(DONE, pods)
    assert out is not None and out.start_source == tracking.StartSource.CONTAINER
    assert out.actual.seconds == 7 * 60, "lastState's 00:03 start, not the init container's"


def test_without_container_statuses_the_pod_then_the_job_start_stands_in() -> None:
    pods = [{"status": {"startTime": "2026-01-01T00:02:00Z"}}]
    by_pod = tracking.job_outcome(DONE, pods)
    assert by_pod is not None and by_pod.start_source == tracking.StartSource.POD
    assert by_pod.actual.seconds == 8 * 60
    by_job = tracking.job_outcome(DONE, [])
    assert by_job is not None and by_job.start_source == tracking.StartSource.JOB
    assert by_job.actual.seconds == 10 * 60
