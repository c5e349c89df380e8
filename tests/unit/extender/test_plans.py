"""Pod annotations → PodPlan, and GPU type resolution."""

from __future__ import annotations

import pytest

from gpuplan_estimator import devices
from gpuplan_operator.extender import plans
from gpuplan_testing import extender_builders as builders

H100 = "NVIDIA-H100-80GB-HBM3"


def test_unannotated_pod_is_unmanaged() -> None:
    assert plans.plan_for_pod(builders.make_pod("p", gpus=8), plans.resolve_gfd_only) is None


@pytest.mark.parametrize(
    ("gpus", "count", "expected"),
    [
        (8, None, 8),  # the pod's own request
        (None, "4", 4),  # no request: the count annotation
        (2, "16", 2),  # a multi-pod job's count is not per node: the pod's request wins
        (None, None, 0),
    ],
)
def test_gpu_count(gpus: int | None, count: str | None, expected: int) -> None:
    pod = builders.make_pod("p", gpus=gpus, gpu_type=H100, gpu_count=count)
    plan = plans.plan_for_pod(pod, plans.resolve_gfd_only)
    assert plan is not None and plan.gpus == expected
    assert plan.accepted_products == frozenset({H100.casefold()})


def test_count_only_means_any_type() -> None:
    plan = plans.plan_for_pod(builders.make_pod("p", gpu_count="2"), plans.resolve_gfd_only)
    assert plan == plans.PodPlan(planned_type=None, accepted_products=None, gpus=2)


@pytest.mark.parametrize(
    ("gpu_type", "count", "field"),
    [
        ("  ", None, "gpuplan.io/gpu-type"),
        (H100, "two", "gpuplan.io/gpu-count"),
        (H100, "0", "gpuplan.io/gpu-count"),
        (H100, "-1", "gpuplan.io/gpu-count"),
    ],
)
def test_malformed_annotations_name_the_annotation(
    gpu_type: str, count: str | None, field: str
) -> None:
    pod = builders.make_pod("p", gpus=1, gpu_type=gpu_type, gpu_count=count)
    with pytest.raises(plans.PlanError) as info:
        plans.plan_for_pod(pod, plans.resolve_gfd_only)
    assert info.value.field == field


def test_fractional_gpu_request_is_a_plan_error() -> None:
    pod = builders.make_pod("p", gpu_type=H100)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1500m"}}
    with pytest.raises(plans.PlanError, match="fractional"):
        plans.plan_for_pod(pod, plans.resolve_gfd_only)


def test_catalog_resolver_maps_keys_nvml_names_and_labels() -> None:
    resolve = plans.catalog_resolver(devices.load_catalog())
    h100 = frozenset({H100.casefold(), H100.casefold() + "-shared"})
    assert resolve(H100) == h100
    assert resolve("h100-sxm-80gb") == h100 | {"h100-sxm-80gb", "h100-sxm-80gb-shared"}
    assert H100.casefold() in resolve("NVIDIA H100 80GB HBM3")  # the NVML spelling
    assert resolve("NVIDIA-Z9000") == frozenset({"nvidia-z9000"})  # unknown: must match itself


def test_catalog_plan_passes_matching_gfd_node() -> None:
    from gpuplan_operator.extender import scoring
    from gpuplan_operator.extender.inventory import NodeGpus

    resolve = plans.catalog_resolver(devices.load_catalog())
    plan = plans.plan_for_pod(builders.make_pod("p", gpus=8, gpu_type="h100-sxm-80gb"), resolve)
    assert plan is not None
    assert scoring.node_verdict(NodeGpus("n", H100, 8, 0), plan) is None
    verdict = scoring.node_verdict(NodeGpus("n", "NVIDIA-L4", 4, 0), plan)
    assert verdict is not None and verdict.reason == "type NVIDIA-L4 != planned h100-sxm-80gb"
