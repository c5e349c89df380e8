"""Issue #32: the pure parts of living beside other schedulers (scheduler choice, PodGroups,
Kueue's maximum execution time, relative speeds) and of quota-aware plans."""

from __future__ import annotations

import json
from typing import Any

import pytest

from gpuplan_operator.core import gangs, manifests, quotas
from gpuplan_testing.operator_builders import make_plan

OPTED = {gangs.SCHEDULER_OPT_IN_LABEL: gangs.SCHEDULER_OPT_IN_VALUE}


@pytest.mark.parametrize(("template", "scope", "labels", "tj", "expected"), [
    ("kai-scheduler", "all", OPTED, True, None),       # the tenant's scheduler always wins
    (None, "opt-in", {}, None, None),                    # not opted in: default scheduler
    (None, "opt-in", OPTED, None, "gpuplan-scheduler"),  # namespace label opts in
    (None, "opt-in", {}, True, "gpuplan-scheduler"),     # the TrainingJob opts in
    (None, "opt-in", OPTED, False, None),                # ... or out
    (None, "all", {}, None, "gpuplan-scheduler"),
])
def test_the_scheduler_is_the_tenants_else_gpuplans_where_opted_in(
        template: str | None, scope: str, labels: dict[str, str], tj: bool | None,
        expected: str | None) -> None:
    assert gangs.scheduler_for(template, "gpuplan-scheduler", scope=scope,
                               namespace_labels=labels, tj_opt_in=tj) == expected
    assert gangs.scheduler_for(template, "", scope=scope, namespace_labels=labels,
                               tj_opt_in=tj) is None


def test_the_first_served_podgroup_api_is_used() -> None:
    assert gangs.first_served(["batch/v1", "kueue.x-k8s.io/v1beta2"]) is None
    served = ["scheduling.x-k8s.io/v1alpha1", "scheduling.volcano.sh/v1beta1"]
    api = gangs.first_served(served)
    assert api is not None and api.scheduler == "volcano"
    assert gangs.first_served([*served, "scheduling.run.ai/v2alpha2"]).scheduler == "kai"  # type: ignore[union-attr]


@pytest.mark.parametrize(("scheduler", "where", "key", "queue"), [
    ("kai", "annotations", "pod-group-name", "team-a"),
    ("volcano", "annotations", "scheduling.k8s.io/group-name", "default"),
    ("coscheduling", "labels", "scheduling.x-k8s.io/pod-group", ""),
])
def test_a_multi_node_job_joins_its_gang_as_each_scheduler_reads_it(
        scheduler: str, where: str, key: str, queue: str) -> None:
    api = next(a for a in gangs.PODGROUP_APIS if a.scheduler == scheduler)
    plan = make_plan(gpu_count=16, gpus_per_node=8, nodes=2)
    template = {"metadata": {"labels": {"kai.scheduler/queue": "team-a"}},
                "spec": {"containers": [{"name": "t", "image": "i"}]}}
    job = manifests.build_job(owner=manifests.Owner("tj", "uid"), namespace="ns", plan=plan,
                              template=template,
                              placement=manifests.Placement(podgroup=api))
    pod_meta = job["spec"]["template"]["metadata"]
    assert pod_meta[where][key] == job["metadata"]["name"]
    group = gangs.build_podgroup(api, name=job["metadata"]["name"], namespace="ns",
                                 min_member=job["spec"]["parallelism"],
                                 queue=gangs.queue_of(api, pod_meta),
                                 owner_references=manifests.owner_references(
                                     manifests.Owner("tj", "uid")), labels={})
    assert group["apiVersion"] == f"{api.group}/{api.version}"
    assert group["spec"]["minMember"] == 2
    assert group["spec"].get("queue", "") == queue


def test_the_job_keeps_the_tenants_scheduler_and_requests_the_pools_resource() -> None:
    plan = make_plan(gpu_type="NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", gpu_count=1,
                     gpus_per_node=1, nodes=1)
    template = {"spec": {"schedulerName": "volcano", "containers": [
        {"name": "t", "image": "i", "resources": {"limits": {"nvidia.com/gpu": "8"}}}]}}
    placement = manifests.Placement(
        gpu_resource="nvidia.com/mig-1g.10gb",
        node_labels=(("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),),
        scheduler_name="gpuplan-scheduler", max_exec_time_s=5400)
    job = manifests.build_job(owner=manifests.Owner("tj", "uid"), namespace="ns", plan=plan,
                              template=template, placement=placement)
    pod = job["spec"]["template"]["spec"]
    assert pod["schedulerName"] == "volcano"
    assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.product", "operator": "In",
                                         "values": ["NVIDIA-A100-SXM4-80GB"]}]
    assert job["metadata"]["labels"][gangs.MAX_EXEC_TIME_LABEL] == "5400"


def test_an_unset_scheduler_is_filled_only_when_placement_names_one() -> None:
    template = {"spec": {"containers": [{"name": "t", "image": "i"}]}}
    for name in ("", "gpuplan-scheduler"):
        job = manifests.build_job(owner=manifests.Owner("tj", "uid"), namespace="ns",
                                  plan=make_plan(), template=template,
                                  placement=manifests.Placement(scheduler_name=name))
        assert job["spec"]["template"]["spec"].get("schedulerName", "") == name


def test_max_exec_time_is_the_p90_times_the_margin_rounded_up() -> None:
    assert gangs.max_exec_time_s(3600.2, 1.5) == 5401
    assert gangs.max_exec_time_s(3600.0, 0) is None


def test_relative_speeds_divide_each_types_fastest_time_into_the_plans() -> None:
    alternatives: list[dict[str, Any]] = [
        {"gpuType": "NVIDIA-L4", "estimatedSeconds": 4000.0},
        {"gpuType": "NVIDIA-L4", "estimatedSeconds": 2000.0},
        {"gpuType": "NVIDIA-H100-80GB-HBM3", "estimatedSeconds": 500.0},
    ]
    speeds = gangs.relative_speeds("NVIDIA-A100-SXM4-80GB", 1000.0, alternatives)
    assert speeds == {"NVIDIA-A100-SXM4-80GB": 1.0, "NVIDIA-H100-80GB-HBM3": 2.0,
                      "NVIDIA-L4": 0.5}
    plan = make_plan()
    annotation = manifests.plan_annotations(plan)[gangs.RELATIVE_SPEED_ANNOTATION]
    assert json.loads(annotation) == manifests.relative_speeds(plan)


def quota(name: str, hard: dict[str, str], used: dict[str, str],
          scopes: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard}
    if scopes:
        spec["scopes"] = scopes
    return {"metadata": {"name": name}, "spec": spec, "status": {"hard": hard, "used": used}}


def test_the_tightest_unscoped_quota_bounds_gpus_and_jobs() -> None:
    room = quotas.quota_room([
        quota("team", {"requests.nvidia.com/gpu": "16", "count/jobs.batch": "10"},
              {"requests.nvidia.com/gpu": "8", "count/jobs.batch": "3"}),
        quota("small", {"requests.nvidia.com/gpu": "12"}, {"requests.nvidia.com/gpu": "2"}),
        quota("scoped", {"requests.nvidia.com/gpu": "1"}, {}, scopes=["BestEffort"]),
    ])
    assert room == quotas.QuotaRoom(gpus=8, gpu_quota="team", jobs=7, job_quota="team")
    assert quotas.capped_max_gpus(16, room) == 8
    assert quotas.capped_max_gpus(4, room) == 4
    assert room.describe() == ("ResourceQuota team leaves 8 requests.nvidia.com/gpu; "
                               "ResourceQuota team leaves 7 count/jobs")
    none = quotas.quota_room([quota("cpu", {"requests.cpu": "8"}, {})])
    assert (none.gpus, none.jobs, none.describe()) == (None, None, "")
    assert quotas.capped_max_gpus(16, none) == 16


def test_a_spent_quota_leaves_zero() -> None:
    room = quotas.quota_room([quota("q", {"requests.nvidia.com/gpu": "4"},
                                    {"requests.nvidia.com/gpu": "6"})])
    assert room.gpus == 0



def test_the_trainingjobs_scheduler_choice_is_checked_by_field() -> None:
    from gpuplan_operator.core import validation
    from gpuplan_testing.operator_builders import SpecBuilder

    bad = SpecBuilder().set("scheduling.gpuplanScheduler", "yes").obj()
    assert validation.validate_spec(bad) == [
        "spec.scheduling.gpuplanScheduler: must be true or false, got 'yes'"]
    good = SpecBuilder().set("scheduling.gpuplanScheduler", False).obj()
    assert validation.parse_spec(good).gpuplan_scheduler is False
    assert validation.parse_spec(SpecBuilder().obj()).gpuplan_scheduler is None
