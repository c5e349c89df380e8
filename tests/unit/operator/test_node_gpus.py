"""Issue #32: a node's GPU labels (GFD, MIG single and mixed, time-slicing, HAMi, GKE) → what
the inventory offers plans, and what it leaves out."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_operator.core import gpu_pools, node_gpus

A100 = "NVIDIA-A100-SXM4-80GB"


def node(name: str, labels: dict[str, str], allocatable: dict[str, str],
         annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels, "annotations": annotations or {}},
            "spec": {}, "status": {"allocatable": allocatable,
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def pod(node_name: str, resource: str, count: str) -> dict[str, Any]:
    return {"spec": {"nodeName": node_name,
                     "containers": [{"resources": {"limits": {resource: count}}}]},
            "status": {"phase": "Running"}}


def mig_single(name: str) -> dict[str, Any]:
    # GFD single strategy: 8 GPUs x 7 instances of 1g.10gb, the product names the profile
    return node(name, {"nvidia.com/gpu.product": f"{A100}-MIG-1g.10gb",
                       "nvidia.com/gpu.count": "56", "nvidia.com/mig.strategy": "single"},
                {"nvidia.com/gpu": "56"})


def mig_mixed(name: str) -> dict[str, Any]:
    # GFD mixed strategy: the product is the board, each profile a resource of its own; two
    # GPUs are left whole
    return node(name, {"nvidia.com/gpu.product": A100, "nvidia.com/gpu.count": "8",
                       "nvidia.com/mig.strategy": "mixed"},
                {"nvidia.com/gpu": "2", "nvidia.com/mig-1g.10gb": "14",
                 "nvidia.com/mig-3g.40gb": "8", "cpu": "64"})


def test_plain_gfd_nodes_offer_whole_gpus_by_product() -> None:
    n = node("a0", {"nvidia.com/gpu.product": A100, "nvidia.com/gpu.count": "8"},
             {"nvidia.com/gpu": "8"})
    assert node_gpus.node_gpus(n) == node_gpus.NodeGpuOffers((node_gpus.GpuOffer(
        A100, "nvidia.com/gpu", (("nvidia.com/gpu.product", A100),), 8, 8),))


def test_mig_single_strategy_is_a_pool_of_instances_one_per_pod() -> None:
    pools = gpu_pools.build_inventory([mig_single("m0"), mig_single("m1")],
                                      [pod("m0", "nvidia.com/gpu", "3")])
    assert pools == [gpu_pools.ClusterGpuPool(f"{A100}-MIG-1g.10gb", gpus_per_node=1, nodes=112,
                                       free_gpus=109)]
    assert pools[0].selector() == (("nvidia.com/gpu.product", f"{A100}-MIG-1g.10gb"),)


def test_mig_mixed_strategy_is_a_pool_per_profile_with_its_resource() -> None:
    pools = gpu_pools.build_inventory([mig_mixed("x0")], [pod("x0", "nvidia.com/mig-1g.10gb",
                                                              "4")])
    by_type = {p.gpu_type: p for p in pools}
    assert sorted(by_type) == [A100, f"{A100}-MIG-1g.10gb", f"{A100}-MIG-3g.40gb"]
    whole = by_type[A100]
    assert (whole.gpus_per_node, whole.nodes, whole.free_gpus) == (2, 1, 2)
    small = by_type[f"{A100}-MIG-1g.10gb"]
    assert (small.gpus_per_node, small.nodes, small.free_gpus) == (1, 14, 10)
    assert small.resource == "nvidia.com/mig-1g.10gb"
    # steered by the board's product label: the resource request picks the instance
    assert small.selector() == (("nvidia.com/gpu.product", A100),)
    assert small.to_request() == {"gpu_type": f"{A100}-MIG-1g.10gb", "gpus_per_node": 1,
                                  "nodes": 14, "free_gpus": 10}


@pytest.mark.parametrize(("labels", "annotations", "why"), [
    ({"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.replicas": "4",
      "nvidia.com/gpu.count": "1"}, {}, "4 replicas of 1 GPU(s)"),
    ({"nvidia.com/gpu.product": "NVIDIA-L4-SHARED"}, {}, "ends in -SHARED"),
    ({"nvidia.com/gpu.product": "NVIDIA-L4"}, {"hami.io/node-nvidia-register": "[]"}, "HAMi"),
    ({"cloud.google.com/gke-accelerator": "nvidia-l4",
      "cloud.google.com/gke-gpu-sharing-strategy": "time-sharing"}, {}, "GKE time-sharing"),
])
def test_shared_gpus_are_never_offered_as_whole_gpus(labels: dict[str, str],
                                                     annotations: dict[str, str],
                                                     why: str) -> None:
    n = node("ts-0", labels, {"nvidia.com/gpu": "4"}, annotations)
    assert gpu_pools.build_inventory([n], []) == []
    excluded = gpu_pools.excluded_nodes([n])
    assert why in excluded["ts-0"]
    assert "1 node(s) with shared GPUs left out of plans" in gpu_pools.describe_excluded(excluded)


def test_replicas_of_one_are_not_sharing() -> None:
    n = node("l4-0", {"nvidia.com/gpu.product": "NVIDIA-L4", "nvidia.com/gpu.replicas": "1"},
             {"nvidia.com/gpu": "4"})
    assert gpu_pools.build_inventory([n], []) == [gpu_pools.ClusterGpuPool("NVIDIA-L4", 4, 1, 4)]


def test_gke_accelerator_labels_without_gfd_name_the_board() -> None:
    l4 = node("gke-l4", {"cloud.google.com/gke-accelerator": "nvidia-l4"},
              {"nvidia.com/gpu": "1"})
    h100 = node("gke-h100", {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
                {"nvidia.com/gpu": "8"})
    mig = node("gke-mig", {"cloud.google.com/gke-accelerator": "nvidia-tesla-a100",
                           "cloud.google.com/gke-gpu-partition-size": "1g.5gb"},
               {"nvidia.com/gpu": "7"})
    pools = {p.gpu_type: p for p in gpu_pools.build_inventory([l4, h100, mig], [])}
    assert pools["NVIDIA-L4"].selector() == (("cloud.google.com/gke-accelerator", "nvidia-l4"),)
    assert pools["NVIDIA-H100-80GB-HBM3"].gpus_per_node == 8
    sliced = pools["NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"]
    assert (sliced.gpus_per_node, sliced.nodes) == (1, 7)
    assert sliced.selector() == (("cloud.google.com/gke-accelerator", "nvidia-tesla-a100"),
                                 ("cloud.google.com/gke-gpu-partition-size", "1g.5gb"))


def test_gke_names_resolve_in_the_estimator_catalog() -> None:
    from gpuplan_estimator.devices import load_catalog
    catalog = load_catalog()
    for product in node_gpus.GKE_ACCELERATORS.values():
        catalog.resolve(product)
    catalog.resolve("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")


def test_unlabelled_or_unknown_accelerators_offer_nothing() -> None:
    assert node_gpus.node_gpus(node("cpu", {}, {"cpu": "8"})).offers == ()
    odd = node("odd", {"cloud.google.com/gke-accelerator": "nvidia-unknown"},
               {"nvidia.com/gpu": "1"})
    assert node_gpus.node_gpus(odd).offers == ()
