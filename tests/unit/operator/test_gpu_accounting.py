"""GPU accounting of pods and nodes, the one module the operator and the extender share."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_operator.core import gpu_accounting, gpu_pools
from gpuplan_operator.extender.core import snapshot


@pytest.mark.parametrize(("raw", "value"), [("8", 8), (8, 8), ("0", 0), ("4000m", 4)])
def test_parse_gpu_quantity(raw: object, value: int) -> None:
    assert gpu_accounting.parse_gpu_quantity(raw) == value


@pytest.mark.parametrize("raw", ["1.5", "1500m", "-1", -1, "x", True, None, "1Ki", "²", "٣",
                                 "٣000m", "", "m", "9" * 5000])
def test_parse_gpu_quantity_rejects(raw: object) -> None:
    with pytest.raises(gpu_accounting.QuantityError):
        gpu_accounting.parse_gpu_quantity(raw)


def gpus(n: int, *, field: str = "limits") -> dict[str, Any]:
    return {field: {"nvidia.com/gpu": str(n)}}


def container(name: str, n: int, *, field: str = "limits", sidecar: bool = False
              ) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "resources": gpus(n, field=field)}
    if sidecar:
        out["restartPolicy"] = "Always"
    return out


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None,
        overhead: int | None = None, node: str | None = "n1", phase: str = "Running"
        ) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers, "initContainers": init or []}
    if node is not None:
        spec["nodeName"] = node
    if overhead is not None:
        spec["overhead"] = {"nvidia.com/gpu": str(overhead)}
    return {"metadata": {"name": "p", "uid": "u"}, "spec": spec, "status": {"phase": phase}}


@pytest.mark.parametrize(("p", "expected"), [
    (pod([container("a", 2)]), 2),
    (pod([container("a", 2, field="requests")]), 2),
    (pod([container("a", 2), container("b", 1)]), 3),
    # A plain init container runs alone before the app: its peak counts if larger.
    (pod([container("a", 2), container("b", 1)], [container("warm", 4)]), 4),
    (pod([container("a", 2), container("b", 1)], [container("warm", 1)]), 3),
    # A sidecar started before an init container runs beside it, and beside the app.
    (pod([container("a", 2), container("b", 1)],
         [container("side", 1, sidecar=True), container("warm", 4)]), 5),
    (pod([container("a", 2)], [container("warm", 1), container("side", 1, sidecar=True)]), 3),
    (pod([container("a", 2)], overhead=1), 3),
    (pod([{"name": "cpu-only"}]), 0),
])
def test_pod_gpu_request_counts_as_kubernetes_does(p: dict[str, Any], expected: int) -> None:
    assert gpu_accounting.pod_gpu_request(p) == expected


def test_operator_and_extender_count_the_same_pod_alike() -> None:
    p = pod([container("a", 2), container("b", 1)],
            [container("side", 1, sidecar=True), container("warm", 4)])
    usage = snapshot.pod_usage(p)
    assert usage is not None and usage.gpus == 5
    assert gpu_pools.gpu_requests_by_node([p]) == {"n1": 5}


@pytest.mark.parametrize(("node", "phase", "holds"), [
    ("n1", "Running", "n1"), ("n1", "Pending", "n1"), ("n1", "Succeeded", None),
    ("n1", "Failed", None), (None, "Pending", None),
])
def test_only_bound_live_pods_hold_gpus(node: str | None, phase: str, holds: str | None
                                        ) -> None:
    assert gpu_accounting.holds_gpus_on(pod([container("a", 1)], node=node, phase=phase)) == holds


@pytest.mark.parametrize("phase", ["Pending", "Running", "Succeeded", "Failed", "Unknown"])
def test_listed_pods_are_those_that_hold_gpus(phase: str) -> None:
    # What kube and the watcher list (the field selector) and what the accounting counts agree.
    terms = gpu_accounting.ACTIVE_PODS_FIELD_SELECTOR.split(",")
    assert terms and all(t.startswith("status.phase!=") for t in terms)
    listed = all(t.removeprefix("status.phase!=") != phase for t in terms)
    holds = gpu_accounting.holds_gpus_on(pod([container("a", 1)], phase=phase)) is not None
    assert listed == holds


def test_node_fields_tolerate_missing_and_malformed_data() -> None:
    node = {"metadata": {"name": "n", "labels": {"nvidia.com/gpu.product": "NVIDIA-L4"}},
            "status": {"allocatable": {"nvidia.com/gpu": "4"}}}
    assert gpu_accounting.node_product(node) == "NVIDIA-L4"
    assert gpu_accounting.node_allocatable_gpus(node) == 4
    node["status"]["allocatable"]["nvidia.com/gpu"] = "lots"
    assert gpu_accounting.node_allocatable_gpus(node) is None
    assert gpu_accounting.node_allocatable_gpus({}) is None
    assert gpu_accounting.node_product({"metadata": {"labels": {}}}) is None
