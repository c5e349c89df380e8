"""Pod annotations → PodPlan, and GPU type resolution."""

from __future__ import annotations

import pytest

from gpuplan_estimator.devices import DeviceSpec
from gpuplan_operator.extender import builders, plans

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


def _spec(key: str, *gfd: str) -> DeviceSpec:
    return DeviceSpec(key=key, name=key, vendor="nvidia", memory_bytes=1, mem_bandwidth_gbps=1.0,
                      peak_tflops={}, sm_count=1, boost_clock_mhz=1.0, l2_cache_mb=1.0,
                      gfd_products=gfd)


def test_catalog_resolver_maps_keys_and_aliases() -> None:
    resolve = plans.catalog_resolver([
        _spec("h100-sxm-80gb", H100, "NVIDIA-H100-SXM5-80GB"),
        _spec("cpu"),
    ])
    both = frozenset({H100.casefold(), "nvidia-h100-sxm5-80gb"})
    assert resolve("h100-sxm-80gb") == both
    assert resolve("H100-SXM-80GB") == both
    assert resolve(H100) == both  # an alias accepts its siblings
    assert resolve("NVIDIA-L4") == frozenset({"nvidia-l4"})  # unknown: itself
    assert resolve("cpu") == frozenset({"cpu"})  # no GFD products: itself
