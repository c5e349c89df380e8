"""Pod annotations → PodPlan, and GPU type resolution."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuplan_estimator import devices
from gpuplan_operator.extender.core import plans
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
    from gpuplan_operator.extender.core import scoring
    from gpuplan_operator.extender.core.snapshot import NodeGpus

    resolve = plans.catalog_resolver(devices.load_catalog())
    plan = plans.plan_for_pod(builders.make_pod("p", gpus=8, gpu_type="h100-sxm-80gb"), resolve)
    assert plan is not None
    assert scoring.node_verdict(NodeGpus("n", H100, 8, 0), plan) is None
    verdict = scoring.node_verdict(NodeGpus("n", "NVIDIA-L4", 4, 0), plan)
    assert verdict is not None and verdict.reason == "type NVIDIA-L4 != planned h100-sxm-80gb"


# -- malformed pods: a PlanError naming the field, never another exception ------------------------

GPU_LIMIT = "spec.containers[0].resources.limits[nvidia.com/gpu]"


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """A mutation setting the dotted `path` (list indices as digits) of a pod to `value`."""

    def mutate(pod: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = pod
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        node[int(last) if last.isdigit() else last] = value

    return mutate


MALFORMED = [
    ("metadata", "x", "metadata"),
    ("metadata.annotations", ["gpuplan.io/gpu-type"], "metadata.annotations"),
    ("metadata.annotations", "gpuplan.io/gpu-type=H100", "metadata.annotations"),
    ("spec", 3, "spec"),
    ("spec.containers", "trainer", "spec.containers"),
    ("spec.containers", {"name": "trainer"}, "spec.containers"),
    ("spec.containers.0", None, "spec.containers[0]"),
    ("spec.initContainers", [None], "spec.initContainers[0]"),
    ("spec.initContainers", [{"resources": {"limits": {"nvidia.com/gpu": "1.5"}}}],
     "spec.initContainers[0].resources.limits[nvidia.com/gpu]"),
    ("spec.containers.0.resources", [], "spec.containers[0].resources"),
    ("spec.containers.0.resources", "8", "spec.containers[0].resources"),
    ("spec.containers.0.resources.limits", ["nvidia.com/gpu"],
     "spec.containers[0].resources.limits"),
    ("spec.overhead", [1], "spec.overhead"),
    ("spec.overhead", {"nvidia.com/gpu": "²"}, "spec.overhead[nvidia.com/gpu]"),
]
BAD_QUANTITIES = ["²", "٣", "9" * 5000, "1" * 30, "1e3", "1.5", "-1", "", "m", " 1", "8mm",
                  "1500m", 10**4000, 10**7, -1, 1.0, True, [1], {"n": 1},
                  float("inf"), float("nan")]
BAD_COUNTS = ["²", "٣", "9" * 5000, str(10**7), "0", "-1", "1.0", "", 4, ["4"]]


def managed_pod() -> dict[str, Any]:
    return builders.make_pod("p", gpus=1, gpu_type=H100)


@pytest.mark.parametrize(("path", "value", "field"), MALFORMED)
def test_malformed_pod_is_a_plan_error_naming_the_field(path: str, value: Any, field: str) -> None:
    pod = managed_pod()
    if path == "spec.containers.0.resources.limits":
        pod["spec"]["containers"][0]["resources"] = {"limits": value}
    else:
        _set(path, value)(pod)
    with pytest.raises(plans.PlanError) as info:
        plans.plan_for_pod(pod, plans.resolve_gfd_only)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


@pytest.mark.parametrize("quantity", BAD_QUANTITIES)
def test_bad_gpu_quantity_is_a_plan_error(quantity: Any) -> None:
    pod = managed_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": quantity}}
    with pytest.raises(plans.PlanError) as info:
        plans.plan_for_pod(pod, plans.resolve_gfd_only)
    assert info.value.field == GPU_LIMIT
    assert len(str(info.value)) < 200  # the reason is repeated for every candidate node


@pytest.mark.parametrize("count", BAD_COUNTS)
def test_bad_gpu_count_annotation_is_a_plan_error(count: Any) -> None:
    pod = builders.make_pod("p", gpu_type=H100)
    pod["metadata"]["annotations"]["gpuplan.io/gpu-count"] = count
    with pytest.raises(plans.PlanError) as info:
        plans.plan_for_pod(pod, plans.resolve_gfd_only)
    assert info.value.field == "gpuplan.io/gpu-count"
    assert len(str(info.value)) < 200


@pytest.mark.parametrize("gpu_type", ["x" * 64, "H" * 300_000, 8, ["H100"], {"a": 1}, ""])
def test_bad_gpu_type_annotation_is_a_plan_error(gpu_type: Any) -> None:
    pod = builders.make_pod("p", gpus=1, gpu_type=H100)
    pod["metadata"]["annotations"]["gpuplan.io/gpu-type"] = gpu_type
    with pytest.raises(plans.PlanError) as info:
        plans.plan_for_pod(pod, plans.resolve_gfd_only)
    assert info.value.field == "gpuplan.io/gpu-type"
    assert len(str(info.value)) < 200


def test_deeply_nested_value_is_reported_not_raised() -> None:
    deep: Any = "x"
    for _ in range(5000):
        deep = [deep]
    pod = managed_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": deep}}
    with pytest.raises(plans.PlanError, match=r"not a GPU quantity: <array>"):
        plans.plan_for_pod(pod, plans.resolve_gfd_only)


def test_large_valid_numbers_and_padding_are_accepted() -> None:
    pod = builders.make_pod("p", gpu_type=H100, gpu_count=" 4096 ")
    assert plans.plan_for_pod(pod, plans.resolve_gfd_only) == plans.PodPlan(
        planned_type=H100, accepted_products=frozenset({H100.casefold()}), gpus=4096)
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "16000m"}}
    plan = plans.plan_for_pod(pod, plans.resolve_gfd_only)
    assert plan is not None and plan.gpus == 16


def test_unmanaged_pod_spec_is_not_read() -> None:
    """Without gpuplan annotations the spec is none of the extender's business."""
    for pod in ({"metadata": {"annotations": {"other": "x"}}, "spec": 3},
                {"metadata": {"annotations": None}, "spec": {"containers": "x"}},
                {"spec": {"initContainers": [None]}}, {}):
        assert plans.plan_for_pod(pod, plans.resolve_gfd_only) is None


def test_a_failing_resolver_is_a_plan_error() -> None:
    def broken(_: str) -> frozenset[str]:
        raise KeyError("catalog")

    with pytest.raises(plans.PlanError, match="cannot resolve 'NVIDIA-H100"):
        plans.plan_for_pod(managed_pod(), broken)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
)
POD_PATHS = ["metadata", "metadata.annotations", "metadata.annotations.gpuplan.io/gpu-count",
             "metadata.annotations.gpuplan.io/gpu-type", "spec", "spec.containers",
             "spec.containers.0", "spec.containers.0.resources",
             "spec.containers.0.resources.limits", "spec.initContainers", "spec.overhead"]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(POD_PATHS), JSON), min_size=1, max_size=4))
def test_plan_for_pod_is_total(mutations: list[tuple[str, Any]]) -> None:
    """Any JSON value anywhere the plan is read from: a plan, None or PlanError, nothing else."""
    pod = managed_pod()
    for path, value in mutations:
        if path.startswith("metadata.annotations.gpuplan.io/"):
            notes = pod.get("metadata", {})
            if isinstance(notes, dict) and isinstance(notes.get("annotations"), dict):
                notes["annotations"][path.removeprefix("metadata.annotations.")] = value
            continue
        with contextlib.suppress(KeyError, IndexError, TypeError):
            _set(path, value)(pod)
    resolve = plans.catalog_resolver(devices.load_catalog())
    try:
        plan = plans.plan_for_pod(pod, resolve)
    except plans.PlanError as exc:
        assert len(str(exc)) < 300
    else:
        assert plan is None or (isinstance(plan.gpus, int) and 0 <= plan.gpus <= plans.MAX_GPUS)
