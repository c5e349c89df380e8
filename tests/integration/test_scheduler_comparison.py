"""A slice of `campaigns.scheduler_comparison` (issue #32, item 4) on the testbed.

Two 8-GPU NVLink H100 nodes: one runs a 4-GPU job that asked for little CPU, the other runs no
GPU job but a CPU-heavy pod (preprocessing). A 1-GPU job arrives. kube-scheduler's MostAllocated
(scoring its default resources, CPU and memory) prefers the busier node by CPU and breaks the
last whole NVLink node; with the gpuplan extender the job packs beside the 4-GPU job and the
whole node stays free for the next 8-GPU job. MostAllocated tuned to score `nvidia.com/gpu`
packs as well, which the test also shows (the extender's win is over the default profile).
"""

from __future__ import annotations

import json
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from testbed_pytest import Testbed

from campaigns import scheduler_comparison as cmp
from campaigns import scheduler_workload as w

pytestmark = pytest.mark.integration

TIMEOUT_S = 60.0
HTTP_TIMEOUT_S = 10
POOL = (w.NodePool("h100", 2, w.H100_SXM, 8, 81559, cpu=208, memory_gib=2000),)
EXPECTED_NODE = {  # variant → node index the 1-GPU job lands on
    "cmp-most-allocated": 1, "cmp-gpuplan": 0, "cmp-most-allocated-gpu": 0, "cmp-default": 0}


@pytest.fixture(scope="module")
def schedulers(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[cmp.Schedulers]:
    if testbed.external:
        pytest.skip("starts kube-scheduler binaries of the local testbed")
    with cmp.running_schedulers(testbed.state, tmp_path_factory.mktemp("schedcmp")) as running:
        yield running


def _filler(name: str, node: str, gpus: int, cpu: int, memory_gib: int) -> dict[str, Any]:
    """A running pod bound directly to `node` (no scheduler involved)."""
    requests = {"cpu": str(cpu), "memory": f"{memory_gib}Gi"}
    if gpus:
        requests[w.GPU_RESOURCE] = str(gpus)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox:1.36",
                                     "resources": {"requests": requests,
                                                   "limits": dict(requests)}}]}}


def _free_in_extender(extender_url: str, spec: w.PodSpec, node: str, pool_id: str) -> str:
    """The extender's filter reason for a probe that needs one GPU more than `node` has free."""
    body = json.dumps({"Pod": w.pod_manifest(spec, "probe", pool_id), "Nodes": None,
                       "NodeNames": [node]}).encode()
    request = urllib.request.Request(f"{extender_url}/filter", data=body,
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=HTTP_TIMEOUT_S) as resp:
        return str(json.loads(resp.read())["FailedNodes"].get(node, ""))


@pytest.mark.parametrize("variant", cmp.VARIANTS, ids=lambda v: v.scheduler_name)
def test_one_gpu_job_keeps_or_breaks_the_last_whole_nvlink_node(
    schedulers: cmp.Schedulers, core_v1: Any, variant: cmp.Variant,
    wait_for: Callable[..., Any],
) -> None:
    pool_id = f"cmpt-{uuid.uuid4().hex[:8]}"
    nodes = [f"{pool_id}-h100-{i}" for i in range(2)]
    with cmp.node_pool(core_v1, POOL, pool_id):
        core_v1.create_namespaced_pod(pool_id, _filler("job4", nodes[0], 4, 8, 64),
                                      _request_timeout=HTTP_TIMEOUT_S)
        core_v1.create_namespaced_pod(pool_id, _filler("prep", nodes[1], 0, 150, 1500),
                                      _request_timeout=HTTP_TIMEOUT_S)
        probe = w.PodSpec("probe", w.H100_SXM, 5, 1, 1, None)
        wait_for(lambda: _free_in_extender(schedulers.extender_url, probe, nodes[0], pool_id)
                 == "4 free GPUs < 5 requested", TIMEOUT_S, "the 4-GPU job in the inventory")
        replay = cmp.Replay(core_v1, variant, pool_id)
        assert w.whole_free_nvlink_nodes(replay.node_states()) == 1

        job = w.PodSpec("job1", w.H100_SXM, 1, 8, 64, None)
        outcome = replay.run([job], repeat=0).outcomes[0]

        assert outcome.bound_at_arrival and outcome.node_product == w.H100_SXM
        bound = core_v1.read_namespaced_pod("job1", pool_id, _request_timeout=HTTP_TIMEOUT_S)
        assert bound.spec.node_name == nodes[EXPECTED_NODE[variant.scheduler_name]]
        whole_left = w.whole_free_nvlink_nodes(replay.node_states())
        assert whole_left == (1 if bound.spec.node_name == nodes[0] else 0)
