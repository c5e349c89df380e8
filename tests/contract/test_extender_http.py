"""The extender app in-process, with request/response JSON exactly as kube-scheduler exchanges it.

Bodies follow `k8s.io/kube-scheduler/extender/v1` (Go field names, no json tags, `null` for nil
pointers, a bare array for prioritize) and `HTTPExtender.send` (POST, any status but 200 is an
error).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuplan_operator.extender.app import AppSettings, make_app
from gpuplan_operator.extender.core.snapshot import Snapshot, build_snapshot
from gpuplan_testing import extender_builders as builders

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"

# A filter request as a nodeCacheCapable kube-scheduler 1.34 sends it: the Pod as the apiserver
# serialised it, "Nodes": null and the candidate names.
FILTER_REQUEST = """{"Pod":{"metadata":{"name":"train-0","namespace":"team-a","uid":"0b6c",
"resourceVersion":"812","creationTimestamp":"2026-01-01T00:00:00Z",
"annotations":{"gpuplan.io/gpu-type":"NVIDIA-H100-80GB-HBM3","gpuplan.io/gpu-count":"8",
"gpuplan.io/estimated-seconds":"5400"}},
"spec":{"containers":[{"name":"trainer","image":"trainer:1","resources":{"limits":
{"nvidia.com/gpu":"8"},"requests":{"nvidia.com/gpu":"8"}},"terminationMessagePolicy":"File",
"imagePullPolicy":"IfNotPresent"}],"restartPolicy":"Never","schedulerName":"gpuplan-scheduler",
"priority":0,"enableServiceLinks":true,"preemptionPolicy":"PreemptLowerPriority"},
"status":{"phase":"Pending","qosClass":"BestEffort"}},
"Nodes":null,"NodeNames":["h100-0","h100-1","h100-2","l4-0","cpu-0"]}"""


class StaticSource:
    """A fixed inventory; `age_s` None means never synced."""

    def __init__(self, snapshot: Snapshot | None, age_s: float | None = 1.0) -> None:
        self._snapshot, self._age_s = snapshot, age_s

    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    def age_s(self) -> float | None:
        return self._age_s


def cluster() -> StaticSource:
    nodes = [builders.make_node("h100-0", H100, 8), builders.make_node("h100-1", H100, 8),
             builders.make_node("h100-2", H100, 8), builders.make_node("l4-0", L4, 4),
             builders.make_node("l4-1", L4, 4), builders.make_node("cpu-0")]
    pods = [builders.make_pod("busy", gpus=6, node_name="h100-1", phase="Running"),
            builders.make_pod("small", gpus=2, node_name="l4-1", phase="Running"),
            builders.make_pod("gone", gpus=8, node_name="h100-2", phase="Succeeded")]
    return StaticSource(build_snapshot(nodes, pods, fresh_at_s=0.0))


def call(source: StaticSource, method: str, path: str, data: Any = None,
         settings: AppSettings | None = None,
         registry: CollectorRegistry | None = None) -> tuple[int, bytes, str]:
    """One request against a fresh app; returns status, body and Content-Type."""
    app = make_app(source, registry or CollectorRegistry(), settings=settings)

    async def go() -> tuple[int, bytes, str]:
        async with TestClient(TestServer(app)) as client:
            body = data if isinstance(data, bytes | str) or data is None else json.dumps(data)
            resp = await client.request(method, path, data=body,
                                        headers={"Content-Type": "application/json"})
            return resp.status, await resp.read(), resp.headers.get("Content-Type", "")

    return asyncio.run(go())


def post(source: StaticSource, verb: str, data: Any, **kw: Any) -> tuple[int, Any]:
    status, body, ctype = call(source, "POST", f"/extender/{verb}", data, **kw)
    assert ctype.startswith("application/json")
    return status, json.loads(body)


def test_filter_planned_pod_exact_response() -> None:
    status, body = post(cluster(), "filter", FILTER_REQUEST)
    assert status == 200
    assert body == {
        "Nodes": None,
        "NodeNames": ["h100-0", "h100-2"],
        "FailedNodes": {"h100-1": "2 free GPUs < 8 requested"},
        "FailedAndUnresolvableNodes": {
            "l4-0": f"type {L4} != planned {H100}",
            "cpu-0": "node has no nvidia.com/gpu.product label",
        },
        "Error": "",
    }


def test_filter_without_node_cache_echoes_passing_node_objects() -> None:
    nodes = [builders.make_node("l4-0", L4, 4), builders.make_node("h100-0", H100, 8)]
    pod = builders.make_pod("p", gpus=2, gpu_type=L4)
    status, body = post(cluster(), "filter", builders.extender_args_full(pod, nodes))
    assert status == 200
    assert body["NodeNames"] is None
    assert body["Nodes"] == {"items": [nodes[0]]}
    assert body["FailedAndUnresolvableNodes"] == {"h100-0": f"type {H100} != planned {L4}"}


def test_filter_unmanaged_pod_passes_untouched_even_before_sync() -> None:
    request = builders.extender_args(builders.make_pod("plain", gpus=1), ["l4-0", "cpu-0"])
    for source in (cluster(), StaticSource(None, None)):
        status, body = post(source, "filter", request)
        assert status == 200
        assert body == {"Nodes": None, "NodeNames": ["l4-0", "cpu-0"], "FailedNodes": {},
                        "FailedAndUnresolvableNodes": {}, "Error": ""}


def test_filter_managed_pod_before_sync_is_an_error() -> None:
    status, body = post(StaticSource(None, None), "filter", FILTER_REQUEST)
    assert status == 503
    assert body["Error"] == "gpuplan inventory has not synced yet"
    assert body["NodeNames"] is None


def test_filter_invalid_plan_fails_every_node_unresolvably() -> None:
    pod = builders.make_pod("p", gpus=1, gpu_type=L4, gpu_count="many")
    status, body = post(cluster(), "filter", builders.extender_args(pod, ["l4-0", "l4-1"]))
    assert status == 200
    reason = "invalid gpuplan plan: gpuplan.io/gpu-count: expected a positive integer, got 'many'"
    assert body["NodeNames"] == []
    assert body["FailedAndUnresolvableNodes"] == {"l4-0": reason, "l4-1": reason}


def test_prioritize_returns_bare_array_packing_partly_used_node() -> None:
    pod = builders.make_pod("p", gpus=2, gpu_type=L4)
    status, body = post(cluster(), "prioritize", builders.extender_args(pod, ["l4-0", "l4-1"]))
    assert status == 200
    assert body == [{"Host": "l4-0", "Score": 1}, {"Host": "l4-1", "Score": 10}]


def test_prioritize_neutral_for_unmanaged_pods_missing_data_and_no_sync() -> None:
    plain = builders.extender_args(builders.make_pod("p", gpus=1), ["l4-0", "ghost"])
    assert post(cluster(), "prioritize", plain) == (
        200, [{"Host": "l4-0", "Score": 0}, {"Host": "ghost", "Score": 0}])
    managed = builders.extender_args(builders.make_pod("p", gpus=1, gpu_type=L4), ["ghost"])
    assert post(cluster(), "prioritize", managed) == (200, [{"Host": "ghost", "Score": 5}])
    assert post(StaticSource(None, None), "prioritize", managed) == (
        200, [{"Host": "ghost", "Score": 5}])
    bad_plan = builders.extender_args(builders.make_pod("p", gpus=1, gpu_count="x"), ["l4-0"])
    assert post(cluster(), "prioritize", bad_plan) == (200, [{"Host": "l4-0", "Score": 0}])


def test_malformed_bodies_get_json_errors_with_4xx() -> None:
    for verb in ("filter", "prioritize"):
        status, body = post(cluster(), verb, b"{not json")
        assert status == 400 and body["Error"].startswith("request body is not JSON")
        status, body = post(cluster(), verb, b"\xff\xfe")
        assert status == 400 and "not JSON" in body["Error"]
        status, body = post(cluster(), verb, {"Pod": {}, "NodeNames": [1]})
        assert (status, body["Error"]) == (422, "NodeNames[0]: expected a string, got number")
        assert body["error"]["reason"] == "InvalidRequest"
        status, body = post(cluster(), verb, [1, 2])
        assert (status, body["Error"]) == (422, "$: expected a JSON object, got array")
        status, body = post(cluster(), verb, b"[" * 100_000)
        assert status == 400


def test_oversized_body_is_413_with_json_error() -> None:
    big = builders.extender_args(builders.make_pod("p"), ["n" * 100] * 200)
    status, body = post(cluster(), "filter", big, settings=AppSettings(max_body_bytes=10_000))
    assert status == 413
    assert body["Error"] == "request body larger than 10000 bytes"


def test_health_readiness_and_staleness() -> None:
    assert call(cluster(), "GET", "/healthz")[0] == 200
    assert call(cluster(), "GET", "/readyz")[0] == 200
    status, text, _ = call(StaticSource(None, None), "GET", "/readyz")
    assert (status, text) == (503, b"inventory not synced")
    stale = StaticSource(cluster().snapshot(), age_s=500.0)
    status, text, _ = call(stale, "GET", "/readyz", settings=AppSettings(stale_after_s=120.0))
    assert (status, text) == (503, b"inventory stale: 500s old")


def test_metrics_count_requests_by_verb_and_result() -> None:
    registry = CollectorRegistry()
    source = cluster()
    app = make_app(source, registry)

    async def go() -> str:
        async with TestClient(TestServer(app)) as client:
            await client.post("/extender/filter", data=FILTER_REQUEST)
            await client.post("/extender/filter", data="{")
            await client.post("/extender/prioritize", data=FILTER_REQUEST)
            return await (await client.get("/metrics")).text()

    text = asyncio.run(go())
    assert 'gpuplan_extender_requests_total{result="ok",verb="filter"} 1.0' in text
    assert 'gpuplan_extender_requests_total{result="http_400",verb="filter"} 1.0' in text
    assert 'gpuplan_extender_requests_total{result="ok",verb="prioritize"} 1.0' in text
    assert 'gpuplan_extender_request_duration_seconds_count{result="ok",verb="filter"} 1.0' in text
    assert "gpuplan_extender_inventory_age_seconds 1.0" in text
    assert "gpuplan_extender_inventory_nodes 6.0" in text
