"""Pure builders of the launched Job and headless Service."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_operator.core import annotations, manifests, resources
from gpuplan_testing.operator_builders import SpecBuilder, make_plan

OWNER = manifests.Owner(name="resnet", uid="uid-1")
TEMPLATE = SpecBuilder().obj()["template"]


def _env(job: dict[str, Any]) -> dict[str, Any]:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_single_node_job() -> None:
    job = manifests.build_job(owner=OWNER, namespace="ns", plan=make_plan(), template=TEMPLATE,
                              scheduler_name="gpuplan-scheduler")
    pod = job["spec"]["template"]
    assert job["metadata"]["name"] == "resnet-train"
    assert job["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert job["metadata"]["ownerReferences"][0]["controller"] is True
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 1
    assert "completionMode" not in job["spec"]
    assert pod["spec"]["schedulerName"] == "gpuplan-scheduler"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    term = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term == [{"matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In",
                                           "values": ["NVIDIA-A100-SXM4-80GB"]}]}]
    assert pod["metadata"]["annotations"][annotations.GPU_TYPE] == "NVIDIA-A100-SXM4-80GB"
    assert pod["metadata"]["labels"][resources.OWNER_LABEL] == "resnet"
    env = _env(job)
    assert env["GPUPLAN_GPU_TYPE"] == "NVIDIA-A100-SXM4-80GB"
    assert env["GPUPLAN_GPU_COUNT"] == "4" and env["GPUPLAN_ESTIMATED_SECONDS"] == "3600"
    assert "MASTER_ADDR" not in env
    assert SpecBuilder().obj()["template"] == TEMPLATE, "the input template must not be mutated"


def test_no_scheduler_name_keeps_default_scheduler() -> None:
    job = manifests.build_job(owner=OWNER, namespace="ns", plan=make_plan(), template=TEMPLATE)
    assert "schedulerName" not in job["spec"]["template"]["spec"]


def test_multi_node_is_indexed_with_torchrun_env() -> None:
    plan = make_plan(gpu_count=16, gpus_per_node=8, nodes=2)
    job = manifests.build_job(owner=OWNER, namespace="ns", plan=plan, template=TEMPLATE,
                              master_port=23456)
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"], spec["completionMode"]) == (2, 2, "Indexed")
    assert spec["template"]["spec"]["subdomain"] == "resnet-train"
    assert spec["template"]["spec"]["containers"][0]["resources"]["limits"] == {
        "nvidia.com/gpu": "8"}
    env = _env(job)
    assert env["MASTER_ADDR"] == "resnet-train-0.resnet-train.ns.svc"
    assert env["MASTER_PORT"] == "23456"
    assert env["WORLD_SIZE"] == "16" and env["NPROC_PER_NODE"] == "8" and env["NNODES"] == "2"
    assert env["NODE_RANK"] == {"fieldRef": {"fieldPath": manifests.COMPLETION_INDEX_FIELD}}
    # the Job carries the total, each pod its own share (the extender reads pods)
    assert job["metadata"]["annotations"][annotations.GPU_COUNT] == "16"
    assert spec["template"]["metadata"]["annotations"][annotations.GPU_COUNT] == "8"


def test_headless_service_selects_the_job_pods() -> None:
    svc = manifests.build_headless_service(owner=OWNER, namespace="ns", master_port=29500)
    assert svc["metadata"]["name"] == "resnet-train"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == {manifests.JOB_NAME_LABEL: "resnet-train"}
    assert svc["spec"]["publishNotReadyAddresses"] is True


def test_user_affinity_terms_each_get_the_gpu_requirement() -> None:
    user_term = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
    template = SpecBuilder().set("template.spec.affinity", {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [user_term, {"matchExpressions": [
                {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["old"]}]}]}}}
    ).obj()["template"]
    job = manifests.build_job(owner=OWNER, namespace="ns", plan=make_plan(), template=template)
    terms = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert [len(t["matchExpressions"]) for t in terms] == [2, 1]
    assert all(t["matchExpressions"][-1]["values"] == ["NVIDIA-A100-SXM4-80GB"] for t in terms)


def test_user_env_is_kept_but_plan_env_wins() -> None:
    template = SpecBuilder().set("template.spec.containers", [{
        "name": "t", "image": "i", "env": [{"name": "LR", "value": "0.1"},
                                           {"name": "GPUPLAN_GPU_COUNT", "value": "99"}],
        "resources": {"requests": {"nvidia.com/gpu": "1", "cpu": "2"}}}]).obj()["template"]
    job = manifests.build_job(owner=OWNER, namespace="ns", plan=make_plan(), template=template)
    env = _env(job)
    assert env["LR"] == "0.1" and env["GPUPLAN_GPU_COUNT"] == "4"
    res = job["spec"]["template"]["spec"]["containers"][0]["resources"]
    assert res["requests"] == {"nvidia.com/gpu": "4", "cpu": "2"}


@pytest.mark.parametrize("name", ["a" * 60, "x" * 253, "1-starts-with-digit", "has.dots.in"])
def test_job_names_are_short_valid_and_distinct(name: str) -> None:
    job = manifests.job_name(name)
    assert len(job) <= manifests.MAX_JOB_NAME
    assert job.endswith("-train") and job[0].isalpha()
    assert all(c.isalnum() or c == "-" for c in job)
    assert manifests.job_name(name) == job
    assert manifests.job_name(name + "b") != job


def test_job_retries_disruptions_and_fails_fast_on_trainer_errors() -> None:
    job = manifests.build_job(owner=OWNER, namespace="ns", plan=make_plan(), template=TEMPLATE)
    spec = job["spec"]
    assert 0 < spec["backoffLimit"] <= 6
    ignore, fail = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}
    assert fail == {"action": "FailJob", "onExitCodes": {
        "containerName": "trainer", "operator": "NotIn", "values": [0]}}
    # Kubernetes accepts a podFailurePolicy only with restartPolicy Never.
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
