"""A multi-node plan admitted as a gang through a real PodGroup scheduler (issue #32, item 4).

scheduler-plugins' kube-scheduler with the Coscheduling plugin (`make test-gangs` builds it, v0.34.7
against the testbed's Kubernetes v1.34.4) schedules pods of the PodGroup the operator builds
(`gangs.build_podgroup` / `join_podgroup`, the coscheduling API). Two 8-GPU H100 kwok nodes, one
held by another job: the plan's two 8-GPU pods wait (the first would fit, but not both), and
both are bound once the other job finishes.

Without the binary this test is skipped, naming `make test-gangs`; `make test-gangs` sets
GPUPLAN_REQUIRE_GANGS=1, which turns the skip into a failure.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import testbed_procs
import yaml
from kubernetes import client
from testbed_pytest import Testbed
from testbed_render import coscheduling_scheduler_config

from campaigns import scheduler_comparison as cmp
from campaigns import scheduler_workload as w
from campaigns.chaos import Child
from gpuplan_operator.core import gangs

pytestmark = pytest.mark.integration

SCHEDULER_NAME = "gpuplan-test-coscheduler"
COSCHEDULING = next(api for api in gangs.PODGROUP_APIS if api.scheduler == "coscheduling")
PERMIT_WAIT_S = 3
HELD_S = 3 * PERMIT_WAIT_S  # the gang must stay unbound this long while it cannot fit whole
RETRY_AFTER_S = 5
"""Coscheduling retries a rejected gang only on a Pod add or a PodGroup add/update (its
EventsToRegister), not when another job's pod goes away; kube-scheduler then moves it back to
the queue after this long in the unschedulable pool (default 5 min; its flush runs every 30 s)."""
TIMEOUT_S = 90.0
HTTP_TIMEOUT_S = 10
POOL = (w.NodePool("h100", 2, w.H100_SXM, 8, 81559, cpu=208, memory_gib=2000),)


def _gang_binaries(testbed: Testbed) -> tuple[pathlib.Path, pathlib.Path]:
    bin_dir = pathlib.Path(testbed.state.get("bin_dir", ""))
    binary, crd = bin_dir / "coscheduler", bin_dir / "scheduler-plugins-crds" / "podgroups.yaml"
    if testbed.external or not (binary.is_file() and crd.is_file()):
        message = f"no Coscheduling scheduler in {bin_dir} (build it with `make test-gangs`)"
        if os.environ.get("GPUPLAN_REQUIRE_GANGS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return binary, crd


@pytest.fixture(scope="module")
def coscheduler(testbed: Testbed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary, crd = _gang_binaries(testbed)
    kubectl = [str(testbed.kubectl_path), f"--kubeconfig={testbed.kubeconfig}"]
    subprocess.run([*kubectl, "apply", "--server-side", "-f", str(crd)], check=True,
                   capture_output=True, timeout=60)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                    "crd/podgroups.scheduling.x-k8s.io"], check=True, capture_output=True,
                   timeout=90)
    workdir = tmp_path_factory.mktemp("coscheduler")
    config = workdir / "config.yaml"
    config.write_text(yaml.safe_dump(coscheduling_scheduler_config(
        str(testbed.kubeconfig), SCHEDULER_NAME, permit_wait_s=PERMIT_WAIT_S, backoff_s=1)))
    (port,) = testbed_procs.free_ports(1)
    kcfg = str(testbed.kubeconfig)
    child = Child("coscheduler", [str(binary), f"--config={config}",
                                  f"--authentication-kubeconfig={kcfg}",
                                  f"--authorization-kubeconfig={kcfg}",
                                  "--bind-address=127.0.0.1", f"--secure-port={port}",
                                  f"--pod-max-in-unschedulable-pods-duration={RETRY_AFTER_S}s"],
                  dict(os.environ), workdir / "coscheduler.log")
    child.start()
    try:
        deadline = time.monotonic() + TIMEOUT_S
        while not testbed_procs.http_ok(f"https://127.0.0.1:{port}/healthz",
                                        testbed_procs.insecure_tls()):
            assert child.alive and time.monotonic() < deadline, child.log_text()[-3000:]
            time.sleep(0.2)
        yield SCHEDULER_NAME
    finally:
        child.stop()


def _gang_pod(name: str, group: str, pool_id: str) -> dict[str, Any]:
    pod = w.pod_manifest(w.PodSpec(name, w.H100_SXM, 8, 96, 900, None), SCHEDULER_NAME, pool_id)
    gangs.join_podgroup(COSCHEDULING, pod["metadata"], group)
    return pod


def _filler(node: str) -> dict[str, Any]:
    gpus = {w.GPU_RESOURCE: "8"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "other-job"},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox:1.36",
                                     "resources": {"requests": gpus, "limits": gpus}}]}}


def test_two_node_plan_waits_for_both_nodes_then_binds_together(
    coscheduler: str, api_client: Any, core_v1: Any, wait_for: Callable[..., Any],
) -> None:
    custom_objects = client.CustomObjectsApi(api_client)
    pool_id = f"gang-{uuid.uuid4().hex[:8]}"
    nodes = [f"{pool_id}-h100-{i}" for i in range(2)]
    with cmp.node_pool(core_v1, POOL, pool_id):
        core_v1.create_namespaced_pod(pool_id, _filler(nodes[1]), _request_timeout=HTTP_TIMEOUT_S)
        group = gangs.build_podgroup(COSCHEDULING, name="plan", namespace=pool_id, min_member=2,
                                     queue="", owner_references=[], labels={})
        custom_objects.create_namespaced_custom_object(
            COSCHEDULING.group, COSCHEDULING.version, pool_id, COSCHEDULING.plural, group,
            _request_timeout=HTTP_TIMEOUT_S)
        for i in range(2):
            core_v1.create_namespaced_pod(pool_id, _gang_pod(f"worker-{i}", "plan", pool_id),
                                          _request_timeout=HTTP_TIMEOUT_S)

        def bound() -> dict[str, str]:
            pods = core_v1.list_namespaced_pod(pool_id, _request_timeout=HTTP_TIMEOUT_S).items
            return {p.metadata.name: p.spec.node_name for p in pods
                    if p.metadata.name.startswith("worker-") and p.spec.node_name}

        held_until = time.monotonic() + HELD_S
        while time.monotonic() < held_until:
            assert bound() == {}, "a gang member was bound while the gang could not fit whole"
            time.sleep(0.5)

        core_v1.delete_namespaced_pod("other-job", pool_id, grace_period_seconds=0,
                                      _request_timeout=HTTP_TIMEOUT_S)
        placed = wait_for(lambda: next((b for b in [bound()] if len(b) == 2), None), TIMEOUT_S,
                          "both gang members bound")
        assert sorted(placed.values()) == nodes
