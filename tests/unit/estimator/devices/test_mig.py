"""Issue #32: a MIG profile is a device of its own, derived from its parent GPU's spec by
NVIDIA's slice table, and the planner plans it as one instance per pod."""

from __future__ import annotations

import base64
import math
import pathlib

import onnx
import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.devices import load_catalog, mig
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.http import wire
from gpuplan_testing.contexts import roofline_context

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def test_a_profile_takes_its_compute_slices_of_the_rates_and_memory_slices_of_the_memory() -> None:
    catalog = load_catalog()
    parent = catalog.resolve("a100-sxm4-80gb")
    one = catalog.resolve("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")
    assert one.key == "a100-sxm4-80gb-mig-1g.10gb"
    assert one.memory_bytes == parent.memory_bytes // 8
    assert one.usable_memory_bytes == parent.usable_memory_bytes // 8
    assert one.mem_bandwidth_gbps == pytest.approx(parent.mem_bandwidth_gbps / 8)
    assert one.l2_cache_mb == pytest.approx(parent.l2_cache_mb / 8)
    assert one.peak_tflops["bf16"] == pytest.approx(parent.peak_tflops["bf16"] / 7)
    assert one.sm_count == round(parent.sm_count / 7)
    assert one.price_per_hour_usd == pytest.approx(parent.price_per_hour_usd / 7)
    # 1g.20gb: the same compute, twice the memory
    wide = catalog.resolve("NVIDIA-A100-SXM4-80GB-MIG-1g.20gb")
    assert wide.peak_tflops == one.peak_tflops
    assert wide.memory_bytes == 2 * one.memory_bytes
    # 3g.40gb on an H100: 3/7 of the SMs, half the memory
    h100 = catalog.resolve("h100-sxm-80gb")
    three = catalog.resolve("NVIDIA-H100-80GB-HBM3-MIG-3g.40gb")
    assert three.peak_tflops["fp8"] == pytest.approx(h100.peak_tflops["fp8"] * 3 / 7)
    assert three.memory_bytes == h100.memory_bytes // 2
    assert "supported-mig-profiles" in three.source


@pytest.mark.parametrize("parent", sorted(mig.PROFILES_BY_PARENT))
def test_every_profile_of_the_table_fits_its_gpu(parent: str) -> None:
    catalog = load_catalog()
    spec = catalog.resolve(parent)
    for name, profile in mig.PROFILES_BY_PARENT[parent].items():
        compute, memory_gb = name.split(".")
        assert int(compute.rstrip("g")) == profile.compute_slices
        # The name's memory is the memory slices' share of the board's, in whole GB.
        assert int(memory_gb.removesuffix("gb")) == round(
            spec.memory_bytes / 2**30 * profile.memory_slices / mig.MEMORY_SLICES)
        derived = catalog.resolve(f"{parent}-mig-{name}")
        assert derived.memory_bytes <= spec.memory_bytes
        assert math.isclose(derived.peak_tflops["fp32"] * mig.COMPUTE_SLICES,
                            spec.peak_tflops["fp32"] * profile.compute_slices)


def test_names_split_into_parent_and_profile() -> None:
    assert mig.split_name("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb") == ("NVIDIA-A100-SXM4-40GB",
                                                                 "1g.5gb")
    assert mig.split_name("a100-sxm4-80gb-mig-7g.80gb+me") == ("a100-sxm4-80gb", "7g.80gb")
    assert mig.split_name("NVIDIA-A100-SXM4-80GB") is None


def test_a_profile_the_gpu_lacks_is_unknown_with_its_real_profiles_suggested() -> None:
    catalog = load_catalog()
    with pytest.raises(errors.UnknownDeviceError) as info:
        catalog.resolve("NVIDIA-A100-SXM4-80GB-MIG-1g.5gb")
    assert "a100-sxm4-80gb-mig-1g.10gb" in info.value.suggestions
    with pytest.raises(errors.UnknownDeviceError):
        catalog.resolve("NVIDIA-L4-MIG-1g.10gb")  # the L4 has no MIG


def test_a_mig_pool_is_planned_as_instances_one_per_pod() -> None:
    body = {
        "model_onnx_b64": base64.b64encode((LIGHT / "light_resnet50.onnx").read_bytes()).decode(),
        "training": {"batch_size": 8, "dataset_size": 1000, "optimizer": "sgd"},
        "objective": {"prefer": "cheapest", "max_gpus": 8},
        "inventory": [{"gpu_type": "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "gpus_per_node": 1,
                       "nodes": 14, "free_gpus": 14}],
    }
    answer = json_documents.plan_request_json(wire.parse_plan_request(body), roofline_context())
    plan = answer["plan"]
    assert plan["device"] == "a100-sxm4-80gb-mig-1g.10gb"
    assert plan["gpu_type"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    assert plan["gpus_per_node"] == 1
    assert plan["nodes"] == plan["gpu_count"] <= 8
