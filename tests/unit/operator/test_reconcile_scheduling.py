"""Issue #32 through a whole reconcile pass against a fake kube and a local estimator: plans
capped by the namespace's ResourceQuota, the tenant's scheduler kept, gpuplan-scheduler opt-in,
gangs through a PodGroup, Kueue's maximum execution time, and FailedCreate as a condition."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuplan_operator import metrics, modelsource, reconcile
from gpuplan_operator.core import errors, gangs, settings
from gpuplan_testing.operator_builders import (
    LocalServer,
    PlanningKube,
    SpecBuilder,
    make_plan,
    no_feasible_plan,
)

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
A100 = "NVIDIA-A100-SXM4-80GB"
JOB = "tj-train"


class Kube(PlanningKube):
    """Four 8-GPU A100 nodes."""

    def __init__(self) -> None:
        super().__init__([
            {"metadata": {"name": f"a{i}", "labels": {"nvidia.com/gpu.product": A100}},
             "spec": {}, "status": {"allocatable": {"nvidia.com/gpu": "8"},
                                    "conditions": [{"type": "Ready", "status": "True"}]}}
            for i in range(4)])


class Estimator:
    """`POST /v1/plans` planning `min(max_gpus, 16)` A100s (8 per node), or rejecting."""

    def __init__(self, reject: bool = False, gpu_type: str = A100, per_node: int = 8) -> None:
        self.requests: list[dict[str, Any]] = []
        self.reject = reject
        self.gpu_type, self.per_node = gpu_type, per_node

    async def plans(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(body)
        if self.reject:
            return no_feasible_plan()
        gpus = min(body["objective"]["max_gpus"], 16)
        per_node = min(gpus, self.per_node)
        return web.json_response({"plan": {
            "gpu_type": self.gpu_type, "device": "a100-sxm4-80gb", "gpu_count": gpus,
            "gpus_per_node": per_node, "nodes": gpus // per_node, "estimated_seconds": 1000.0,
            "interval_seconds": [800.0, 1200.0], "step_time_ms": 10.0,
            "memory_bytes_per_gpu": 1, "cost_usd": 1.0, "predictor": "p"},
            "candidates": [{"gpu_type": "NVIDIA-L4", "gpu_count": 8,
                            "estimated_seconds": 4000.0}]})


def run(kube: Kube, spec: dict[str, Any], estimator: Estimator | None = None,
        **overrides: Any) -> list[tuple[bool, str, str]]:
    events: list[tuple[bool, str, str]] = []
    est = estimator or Estimator()

    def emit(*, warning: bool, reason: str, message: str) -> None:
        events.append((warning, reason, message))

    async def go() -> None:
        app = web.Application()
        app.router.add_post("/v1/plans", est.plans)
        async with LocalServer(app) as srv:
            ctx = reconcile.Context(
                kube=kube,  # type: ignore[arg-type]
                settings=settings.Settings(estimator_url=srv.url, **overrides).validate(),
                metrics=metrics.OperatorMetrics(CollectorRegistry()), clock=lambda: NOW,
                guard=modelsource.UrlGuard())
            tj = reconcile.TrainingJobRef("ns", "tj", "uid-1", 1, {}, emit)
            await reconcile.reconcile(ctx, tj, spec)
    asyncio.run(go())
    return events


def condition(kube: Kube, type_: str) -> dict[str, Any]:
    return next(c for c in kube.status["conditions"] if c["type"] == type_)


def gpu_quota(hard: int, used: int) -> dict[str, Any]:
    counts = {"requests.nvidia.com/gpu": str(hard)}
    return {"metadata": {"name": "gpus"}, "spec": {"hard": counts},
            "status": {"hard": counts, "used": {"requests.nvidia.com/gpu": str(used)}}}


def test_a_plan_is_capped_by_the_namespaces_gpu_quota_and_says_so() -> None:
    kube, est = Kube(), Estimator()
    kube.quotas = [gpu_quota(16, 8)]
    run(kube, SpecBuilder().set("objective.maxGpus", 16).obj(), est)
    assert est.requests[0]["objective"]["max_gpus"] == 8
    assert kube.status["plan"]["gpuCount"] == 8
    planned = condition(kube, "Estimated")
    assert "capped at 8 GPU(s): ResourceQuota gpus leaves 8 requests.nvidia.com/gpu" in (
        planned["message"])


def test_a_spent_quota_is_the_reason_no_plan_is_made() -> None:
    kube, est = Kube(), Estimator()
    kube.quotas = [gpu_quota(8, 8)]
    with pytest.raises(errors.QuotaExceededError):
        run(kube, SpecBuilder().obj(), est)
    assert est.requests == []
    estimated = condition(kube, "Estimated")
    assert (estimated["status"], estimated["reason"]) == ("False", "QuotaExceeded")
    assert "ResourceQuota gpus leaves 0" in estimated["message"]


def test_a_rejection_under_a_quota_names_it() -> None:
    kube = Kube()
    kube.quotas = [gpu_quota(4, 0)]
    with pytest.raises(errors.EstimatorRejectedError):
        run(kube, SpecBuilder().set("objective.maxGpus", 16).obj(), Estimator(reject=True))
    assert condition(kube, "Estimated")["message"].startswith(
        "within ResourceQuota gpus leaves 4 requests.nvidia.com/gpu: ")


def test_the_tenants_scheduler_is_kept_and_gpuplans_only_where_opted_in() -> None:
    kube = Kube()
    spec = SpecBuilder().set("template.spec.schedulerName", "kai-scheduler").obj()
    run(kube, spec, scheduler_name="gpuplan-scheduler", scheduler_scope="all")
    assert kube.jobs[JOB]["spec"]["template"]["spec"]["schedulerName"] == "kai-scheduler"
    kube = Kube()
    run(kube, SpecBuilder().obj(), scheduler_name="gpuplan-scheduler")
    assert "schedulerName" not in kube.jobs[JOB]["spec"]["template"]["spec"]
    kube = Kube()
    kube.namespace_labels = {gangs.SCHEDULER_OPT_IN_LABEL: gangs.SCHEDULER_OPT_IN_VALUE}
    run(kube, SpecBuilder().obj(), scheduler_name="gpuplan-scheduler")
    assert kube.jobs[JOB]["spec"]["template"]["spec"]["schedulerName"] == "gpuplan-scheduler"
    kube = Kube()
    run(kube, SpecBuilder().set("scheduling.gpuplanScheduler", True).obj(),
        scheduler_name="gpuplan-scheduler")
    assert kube.jobs[JOB]["spec"]["template"]["spec"]["schedulerName"] == "gpuplan-scheduler"


def test_a_multi_node_plan_is_a_gang_through_the_served_podgroup_api() -> None:
    kube = Kube()
    kube.served_groups = ["batch/v1", "scheduling.volcano.sh/v1beta1"]
    events = run(kube, SpecBuilder().set("objective.maxGpus", 16).obj())
    group = kube.podgroups[JOB]
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 2, "queue": "default"}
    pod_meta = kube.jobs[JOB]["spec"]["template"]["metadata"]
    assert pod_meta["annotations"]["scheduling.k8s.io/group-name"] == JOB
    assert any(reason == "PodGroupCreated" for _, reason, _ in events)
    # one node: no gang; gang scheduling off: none either
    kube = Kube()
    kube.served_groups = ["scheduling.volcano.sh/v1beta1"]
    run(kube, SpecBuilder().set("objective.maxGpus", 8).obj())
    kube2 = Kube()
    kube2.served_groups = ["scheduling.volcano.sh/v1beta1"]
    run(kube2, SpecBuilder().set("objective.maxGpus", 16).obj(), gang_scheduling="off")
    assert kube.podgroups == kube2.podgroups == {}


def test_kueue_max_exec_time_and_relative_speeds_are_published() -> None:
    kube = Kube()
    run(kube, SpecBuilder().obj(), max_exec_time_margin=1.5)
    job = kube.jobs[JOB]
    assert job["metadata"]["labels"][gangs.MAX_EXEC_TIME_LABEL] == "1800"  # 1200 x 1.5
    assert kube.status["relativeSpeeds"] == {A100: 1.0, "NVIDIA-L4": 0.25}
    assert gangs.RELATIVE_SPEED_ANNOTATION in job["metadata"]["annotations"]
    kube = Kube()
    run(kube, SpecBuilder().obj())
    assert gangs.MAX_EXEC_TIME_LABEL not in kube.jobs[JOB]["metadata"]["labels"]


def test_failed_create_replaces_launched_until_pods_exist() -> None:
    kube = Kube()
    kube.status = {"jobName": JOB, "plan": make_plan().to_status(), "conditions": [
        {"type": "Launched", "status": "True", "reason": "JobCreated", "message": "Job",
         "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}
    job = {"metadata": {"name": JOB, "namespace": "ns", "uid": "job-uid",
                        "labels": {"gpuplan.io/trainingjob": "tj"}}, "status": {}}
    kube.job_objects[JOB] = job
    refused = ('pods "tj-train-0-x" is forbidden: exceeded quota: gpus, requested: '
               "requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=0, limited: "
               "requests.nvidia.com/gpu=4")

    async def go() -> None:
        ctx = reconcile.Context(kube=kube, settings=settings.Settings(),  # type: ignore[arg-type]
                                metrics=metrics.OperatorMetrics(CollectorRegistry()),
                                clock=lambda: NOW, guard=modelsource.UrlGuard())
        noop = lambda _b: lambda **_kw: None  # noqa: E731
        await reconcile.record_failed_create(ctx, "ns", JOB, refused, noop)
        launched = condition(kube, "Launched")
        assert (launched["status"], launched["reason"]) == ("False", "PodsNotCreated")
        assert "exceeded quota: gpus" in launched["message"]
        running = {**job, "status": {"active": 1}}
        await reconcile.record_job(ctx, running, noop)
        assert condition(kube, "Launched")["status"] == "True"
    asyncio.run(go())


def gpu_node(name: str, labels: dict[str, str], allocatable: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}, "spec": {},
            "status": {"allocatable": allocatable,
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def test_mixed_mig_pods_request_the_profile_and_keep_the_default_scheduler() -> None:
    kube = Kube()
    kube.nodes = [gpu_node("mix", {"nvidia.com/gpu.product": A100,
                                   "nvidia.com/mig.strategy": "mixed"},
                           {"nvidia.com/mig-1g.10gb": "7"})]
    est = Estimator(gpu_type=f"{A100}-MIG-1g.10gb", per_node=1)
    run(kube, SpecBuilder().set("objective.maxGpus", 2).obj(), est,
        scheduler_name="gpuplan-scheduler", scheduler_scope="all")
    assert est.requests[0]["inventory"] == [{"gpu_type": f"{A100}-MIG-1g.10gb",
                                             "gpus_per_node": 1, "nodes": 7, "free_gpus": 7}]
    pod = kube.jobs[JOB]["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]
    assert term["matchExpressions"][-1]["values"] == [A100]
    # the extender reads only whole-GPU product labels: node affinity alone places these
    assert "schedulerName" not in pod


def test_no_plan_says_which_shared_gpus_were_left_out() -> None:
    kube = Kube()
    kube.nodes.append(gpu_node("ts-0", {"nvidia.com/gpu.product": "NVIDIA-L40S-SHARED",
                                        "nvidia.com/gpu.replicas": "4",
                                        "nvidia.com/gpu.count": "2"}, {"nvidia.com/gpu": "8"}))
    est = Estimator(reject=True)
    with pytest.raises(errors.EstimatorRejectedError):
        run(kube, SpecBuilder().obj(), est)
    assert [p["gpu_type"] for p in est.requests[0]["inventory"]] == [A100]
    message = condition(kube, "Estimated")["message"]
    assert "1 node(s) with shared GPUs left out of plans" in message
    assert "ts-0 (time-slicing or MPS: 4 replicas of 2 GPU(s)" in message
