"""Pure renderers: kubeconfig, scheduler configurations and fake Node objects from plain data.

Nothing here touches the file system or the network; `gpuplan_testbed.py` writes the results.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from testbed_common import GPUPLAN_SCHEDULER_NAME, TestbedError

MAX_NODES = 500  # a fake cluster larger than this is a typo, and would swamp 2 cores
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")
_GFD_PRODUCT = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]{0,62}$")


def kubeconfig(server_url: str, ca_path: str, cert_path: str, key_path: str) -> dict[str, Any]:
    """Admin kubeconfig with absolute paths (kopf's own loader does not resolve relative ones)."""
    for field, path in (("ca", ca_path), ("cert", cert_path), ("key", key_path)):
        if not path.startswith("/"):
            raise TestbedError(f"kubeconfig {field} path must be absolute, got {path!r}")
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "gpuplan-testbed",
             "cluster": {"server": server_url, "certificate-authority": ca_path}},
        ],
        "users": [
            {"name": "testbed-admin",
             "user": {"client-certificate": cert_path, "client-key": key_path}},
        ],
        "contexts": [
            {"name": "gpuplan-testbed",
             "context": {"cluster": "gpuplan-testbed", "user": "testbed-admin"}},
        ],
        "current-context": "gpuplan-testbed",
    }


def scheduler_config(
    kubeconfig_path: str,
    *,
    scheduler_name: str | None,
    extender_url: str | None = None,
    extender_ignorable: bool = True,
) -> dict[str, Any]:
    """KubeSchedulerConfiguration (v1); `scheduler_name=None` keeps the default profile.

    `--kubeconfig` is ignored when `--config` is given, so the path goes in `clientConnection`.
    Leader election is off: both schedulers would otherwise contend for one Lease.
    """
    config: dict[str, Any] = {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": kubeconfig_path},
        "leaderElection": {"leaderElect": False},
        # Fast retries keep tests short (defaults 1 s / 10 s).
        "podInitialBackoffSeconds": 1,
        "podMaxBackoffSeconds": 2,
    }
    if scheduler_name is not None:
        config["profiles"] = [{"schedulerName": scheduler_name}]
    if extender_url is not None:
        config["extenders"] = [extender_section(extender_url, ignorable=extender_ignorable)]
    return config


def extender_section(url: str, *, ignorable: bool) -> dict[str, Any]:
    """The gpuplan extender: filter + prioritize for pods that request `nvidia.com/gpu` only."""
    return {
        "urlPrefix": url,
        "filterVerb": "filter",
        "prioritizeVerb": "prioritize",
        "weight": 5,
        "nodeCacheCapable": False,
        "managedResources": [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}],
        # ignorable: the scheduler still places pods while no extender listens on the port.
        "ignorable": ignorable,
        "httpTimeout": "10s",
        "enableHTTPS": False,
    }


def gpuplan_scheduler_config(kubeconfig_path: str, extender_port: int,
                             extender_ignorable: bool = True) -> dict[str, Any]:
    return scheduler_config(
        kubeconfig_path,
        scheduler_name=GPUPLAN_SCHEDULER_NAME,
        extender_url=f"http://127.0.0.1:{extender_port}/extender",
        extender_ignorable=extender_ignorable,
    )


def node_manifests(doc: Mapping[str, Any], source: str) -> list[dict[str, Any]]:
    """v1 Node objects for every pool of a `testbed/nodes.yaml` document (`source`: its path)."""
    if not isinstance(doc, Mapping) or doc.get("kind") != "NodePools":
        raise TestbedError(f"{source}: expected a mapping with kind: NodePools")
    pools = doc.get("pools")
    if not isinstance(pools, list) or not pools:
        raise TestbedError(f"{source}: 'pools' must be a non-empty list")
    nodes = [n for i, pool in enumerate(pools) for n in _pool_nodes(pool, f"{source}: pools[{i}]")]
    names = [n["metadata"]["name"] for n in nodes]
    duplicates = sorted({x for x in names if names.count(x) > 1})
    if duplicates:
        raise TestbedError(f"{source}: duplicate node names {duplicates}")
    if len(nodes) > MAX_NODES:
        raise TestbedError(f"{source}: {len(nodes)} nodes exceeds the cap of {MAX_NODES}")
    return nodes


def _pool_nodes(pool: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(pool, Mapping):
        raise TestbedError(f"{where}: must be a mapping")
    prefix = _required(pool, "namePrefix", str, where)
    if not _DNS_LABEL.match(prefix):
        raise TestbedError(f"{where}.namePrefix: {prefix!r} is not a lowercase DNS label")
    count = _required(pool, "count", int, where)
    if not 1 <= count <= MAX_NODES:
        raise TestbedError(f"{where}.count: {count} not in 1..{MAX_NODES}")
    resources = {
        "cpu": str(_required(pool, "cpu", str, where)),
        "memory": str(_required(pool, "memory", str, where)),
        "pods": "110",
    }
    labels: dict[str, str] = {}
    gpu = pool.get("gpu")
    if gpu is not None:
        labels, gpu_count = _gpu_labels(gpu, f"{where}.gpu")
        resources["nvidia.com/gpu"] = str(gpu_count)
    return [_node(f"{prefix}-{i}", labels, resources) for i in range(count)]


def _gpu_labels(gpu: Any, where: str) -> tuple[dict[str, str], int]:
    if not isinstance(gpu, Mapping):
        raise TestbedError(f"{where}: must be a mapping")
    product = _required(gpu, "product", str, where)
    if not _GFD_PRODUCT.match(product):
        raise TestbedError(f"{where}.product: {product!r} is not a valid label value")
    count = _required(gpu, "count", int, where)
    memory_mib = _required(gpu, "memoryMiB", int, where)
    if count < 1 or memory_mib < 1:
        raise TestbedError(f"{where}: count and memoryMiB must be positive")
    labels = {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.memory": str(memory_mib),
    }
    return labels, count


def _required(mapping: Mapping[str, Any], key: str, kind: type, where: str) -> Any:
    if key not in mapping:
        raise TestbedError(f"{where}.{key}: missing")
    value = mapping[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TestbedError(f"{where}.{key}: expected {kind.__name__}, got {value!r}")
    return value


def _node(name: str, gpu_labels: Mapping[str, str], resources: Mapping[str, str]) -> dict[str, Any]:
    labels = {
        "type": "kwok",
        "gpuplan.io/testbed-node": "true",
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        **gpu_labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            # kwok manages only nodes with this annotation
            # (--manage-nodes-with-annotation-selector).
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {},
        # The apiserver keeps status sent on create; kwok's node-initialize merges into it.
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


COSCHEDULING = "Coscheduling"
"""scheduler-plugins' gang plugin (the `coscheduler` binary of `hack/testbed-build.sh --gangs`)."""


def coscheduling_scheduler_config(kubeconfig_path: str, scheduler_name: str, *,
                                  permit_wait_s: int, backoff_s: int) -> dict[str, Any]:
    """A profile with Coscheduling: a PodGroup's pods wait at Permit until `minMember` of them
    are placed, and are all turned back after `permit_wait_s` otherwise (its queue sort keeps a
    group's pods together, so it replaces the default one)."""
    config = scheduler_config(kubeconfig_path, scheduler_name=scheduler_name)
    config["profiles"][0]["plugins"] = {
        "multiPoint": {"enabled": [{"name": COSCHEDULING}]},
        "queueSort": {"enabled": [{"name": COSCHEDULING}], "disabled": [{"name": "*"}]},
    }
    config["profiles"][0]["pluginConfig"] = [{"name": COSCHEDULING, "args": {
        "permitWaitingTimeSeconds": permit_wait_s, "podGroupBackoffSeconds": backoff_s}}]
    return config
