"""The real gpuplan-scheduler (kube-scheduler 1.34 on the testbed) calling our extender.

The extender runs in-process on the port the testbed configured for the second scheduler, with a
private metrics registry so the tests can prove the scheduler called it. Fake GPU nodes come from
testbed/nodes.yaml (4×8 H100, 4×8 A100, 8×4 L4, 2 CPU-only). The testbed may be shared with other
tests, so expectations are computed from the cluster's state right before each pod is created.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from testbed_pytest import Testbed

from gpuplan_operator.core import annotations as plan_keys
from gpuplan_operator.extender import cli, watcher
from gpuplan_operator.extender.core import snapshot
from gpuplan_operator.extender.core.store import NODES

pytestmark = pytest.mark.integration

H100 = "NVIDIA-H100-80GB-HBM3"
L4 = "NVIDIA-L4"
TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10


@dataclass
class RunningExtender:
    base_url: str
    registry: CollectorRegistry

    def requests(self, verb: str, result: str = "ok") -> float:
        value = self.registry.get_sample_value(
            "gpuplan_extender_requests_total", {"verb": verb, "result": result})
        return value or 0.0


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _ready(url: str) -> bool:
    with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
        return bool(resp.status == 200)
    return False


@pytest.fixture(scope="module")
def extender(testbed: Testbed, core_v1: Any) -> Iterator[RunningExtender]:
    port = testbed.extender_port
    if port is None:
        pytest.skip("the testbed has no extender port configured")
    if not _port_free(port):
        pytest.skip(f"extender port {port} is taken (another extender is serving this testbed)")
    registry = CollectorRegistry()
    settings = cli.ServeSettings(host="127.0.0.1", port=port, kubeconfig=str(testbed.kubeconfig),
                                 watch=watcher.WatchSettings(watch_timeout_s=20))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(serve_with(stop))
        except BaseException as exc:  # reported by the fixture below
            failure.append(exc)

    async def serve_with(event: asyncio.Event) -> None:
        await cli.serve(settings, watcher.core_v1_api(settings.kubeconfig), registry, event)

    thread = threading.Thread(target=run, name="gpuplan-extender-test", daemon=True)
    thread.start()
    base_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + TIMEOUT_S
    while not _ready(f"{base_url}/readyz"):
        assert not failure, f"extender failed to start: {failure[0]!r}"
        assert time.monotonic() < deadline, "extender not ready (inventory never synced)"
        time.sleep(0.2)
    try:
        yield RunningExtender(base_url=base_url, registry=registry)
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(15)


def gpu_pod(name: str, gpus: int, *, gpu_type: str | None = None,
            node_name: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox:1.36",
                        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
    }
    if node_name is not None:
        spec["nodeName"] = node_name  # a filler bound directly, bypassing every scheduler
    else:
        spec["schedulerName"] = "gpuplan-scheduler"
    notes = {plan_keys.GPU_TYPE: gpu_type, plan_keys.GPU_COUNT: str(gpus)} if gpu_type else {}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "annotations": notes}, "spec": spec}


def free_gpus_by_node(core_v1: Any, product: str) -> dict[str, int]:
    """Free GPUs per node of `product`, computed with the same pure functions from a fresh list."""
    nodes = json.loads(core_v1.list_node(_preload_content=False,
                                         _request_timeout=HTTP_TIMEOUT_S).data)["items"]
    pods = json.loads(core_v1.list_pod_for_all_namespaces(
        _preload_content=False, _request_timeout=HTTP_TIMEOUT_S).data)["items"]
    snap = snapshot.build_snapshot(nodes, pods, fresh_at_s=0.0)
    return {n.name: n.free_gpus or 0 for n in snap.nodes.values() if n.product == product}


def create(core_v1: Any, namespace: str, pod: dict[str, Any]) -> None:
    core_v1.create_namespaced_pod(namespace, pod, _request_timeout=HTTP_TIMEOUT_S)


def scheduled_node(core_v1: Any, namespace: str, name: str,
                   wait_for: Callable[..., Any]) -> str:
    def node() -> str | None:
        pod = core_v1.read_namespaced_pod(name, namespace, _request_timeout=HTTP_TIMEOUT_S)
        return pod.spec.node_name or None

    return str(wait_for(node, TIMEOUT_S, f"pod {namespace}/{name} to be scheduled"))


def test_planned_8xh100_pod_lands_on_an_h100_node_with_8_free(
    extender: RunningExtender, core_v1: Any, namespace: str, wait_for: Callable[..., Any]
) -> None:
    free = free_gpus_by_node(core_v1, H100)
    partly = next(n for n, f in sorted(free.items()) if f == 8)
    create(core_v1, namespace, gpu_pod("filler", 2, node_name=partly))
    wait_for(lambda: free_gpus_by_node(core_v1, H100)[partly] == 6, TIMEOUT_S, "filler bound")
    whole = {n for n, f in free_gpus_by_node(core_v1, H100).items() if f == 8}
    assert whole, "no H100 node with 8 free GPUs left on the shared testbed"
    before = extender.requests("filter")

    create(core_v1, namespace, gpu_pod("train", 8, gpu_type=H100))
    node = scheduled_node(core_v1, namespace, "train", wait_for)

    assert node in whole
    assert extender.requests("filter") > before


def test_2xl4_pod_packs_onto_a_partly_used_l4_node(
    extender: RunningExtender, core_v1: Any, namespace: str, wait_for: Callable[..., Any]
) -> None:
    free = free_gpus_by_node(core_v1, L4)
    target = next(n for n, f in sorted(free.items()) if f == 4)
    create(core_v1, namespace, gpu_pod("filler", 2, node_name=target))
    wait_for(lambda: free_gpus_by_node(core_v1, L4)[target] == 2, TIMEOUT_S, "filler bound")
    empty = {n for n, f in free_gpus_by_node(core_v1, L4).items() if f == 4}
    assert len(empty) >= 2, "prioritize needs several feasible nodes; the testbed is too full"
    before = extender.requests("prioritize")

    create(core_v1, namespace, gpu_pod("small", 2, gpu_type=L4))
    node = scheduled_node(core_v1, namespace, "small", wait_for)

    assert node not in empty, f"{node} was empty; the partly used {target} should win"
    assert extender.requests("prioritize") > before


def test_unplaceable_pod_stays_pending_with_the_extenders_reason(
    extender: RunningExtender, core_v1: Any, namespace: str, wait_for: Callable[..., Any]
) -> None:
    create(core_v1, namespace, gpu_pod("nowhere", 1, gpu_type="NVIDIA-B200"))

    def failed_scheduling_message() -> str | None:
        events = core_v1.list_namespaced_event(
            namespace, field_selector="involvedObject.name=nowhere",
            _request_timeout=HTTP_TIMEOUT_S).items
        messages = [e.message or "" for e in events if e.reason == "FailedScheduling"]
        return next((m for m in messages if "!= planned" in m), None)

    message = wait_for(failed_scheduling_message, TIMEOUT_S, "FailedScheduling event")
    assert f"type {H100} != planned NVIDIA-B200" in message
    assert f"type {L4} != planned NVIDIA-B200" in message
    pod = core_v1.read_namespaced_pod("nowhere", namespace, _request_timeout=HTTP_TIMEOUT_S)
    assert pod.status.phase == "Pending" and not pod.spec.node_name


def test_inventory_follows_the_watch(
    extender: RunningExtender, core_v1: Any, namespace: str, wait_for: Callable[..., Any]
) -> None:
    free = free_gpus_by_node(core_v1, L4)
    target = max(sorted(free), key=lambda n: free[n])
    create(core_v1, namespace, gpu_pod("holder", 1, node_name=target))
    body = json.dumps({"Pod": gpu_pod("probe", free[target], gpu_type=L4),
                       "Nodes": None, "NodeNames": [target]}).encode()

    def filter_reason() -> str | None:
        request = urllib.request.Request(f"{extender.base_url}/extender/filter", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as resp:
            result = json.loads(resp.read())
        return result["FailedNodes"].get(target)

    reason = wait_for(filter_reason, TIMEOUT_S, "the holder pod to reach the inventory")
    assert reason == f"{free[target] - 1} free GPUs < {free[target]} requested"


def test_real_list_pages_and_watch_ends_on_its_server_timeout(core_v1: Any) -> None:
    settings = watcher.WatchSettings(watch_timeout_s=1, list_page_size=5)
    lw = watcher.KubeListWatch(core_v1, NODES, settings)
    items, rv = lw.list()  # 18+ testbed nodes: at least four pages with `continue` tokens
    names = [item["metadata"]["name"] for item in items]
    assert len(names) >= 18 and len(set(names)) == len(names) and rv
    started = time.monotonic()
    events = list(lw.watch(rv))  # returns cleanly: the stream was live and is now current
    assert time.monotonic() - started < 1 + settings.read_timeout_margin_s
    assert all(e["type"] in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK") for e in events)
