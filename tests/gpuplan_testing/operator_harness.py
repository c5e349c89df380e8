"""Helpers for the operator integration tests: CRD install, KopfRunner, TrainingJob I/O."""

from __future__ import annotations

import base64
import contextlib
import pathlib
import socket
from collections.abc import Callable, Iterator
from typing import Any

import kopf
import onnx
import pytest
from kopf.testing import KopfRunner
from kubernetes import client

ROOT = pathlib.Path(__file__).resolve().parents[2]
CRD = ROOT / "crds" / "trainingjobs.gpuplan.io.yaml"
HANDLERS = ROOT / "operator" / "gpuplan_operator" / "handlers.py"
RESNET50 = pathlib.Path(onnx.__file__).parent / "backend/test/data/light/light_resnet50.onnx"
G, V, P = "gpuplan.io", "v1alpha1", "trainingjobs"
TIMEOUT_S = 60


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_crd(kubectl: Any) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kubectl("wait", "--for=condition=Established", "crd/trainingjobs.gpuplan.io", "--timeout=60s")


@contextlib.contextmanager
def run_operator(monkeypatch: pytest.MonkeyPatch, namespace: str, estimator_url: str,
                 **env: str) -> Iterator[KopfRunner]:
    """The real operator (handlers.py by file path) in a thread, scoped to `namespace`."""
    values = {"ESTIMATOR_URL": estimator_url, "METRICS_PORT": "0",
              "ESTIMATOR_TIMEOUT_SECONDS": "10", "RETRY_BASE_DELAY_SECONDS": "1",
              "RETRY_MAX_DELAY_SECONDS": "2", **env}
    for key, value in values.items():
        monkeypatch.setenv(f"GPUPLAN_{key}", value)
    settings = kopf.OperatorSettings()
    settings.watching.server_timeout = 10
    argv = ["run", "--standalone", "-n", namespace, "--verbose", str(HANDLERS)]
    with KopfRunner(argv, timeout=TIMEOUT_S, registry=kopf.OperatorRegistry(),
                    settings=settings) as runner:
        yield runner


def create_model_configmap(core_v1: Any, namespace: str, name: str = "resnet50-onnx",
                           data: bytes | None = None) -> None:
    blob = RESNET50.read_bytes() if data is None else data
    core_v1.create_namespaced_config_map(namespace, {
        "metadata": {"name": name},
        "binaryData": {"model.onnx": base64.b64encode(blob).decode()}}, _request_timeout=30)


def trainingjob(name: str, *, deadline: str = "4h", max_gpus: int = 8,
                prefer: str = "cheapest",
                gpu_types: list[str] | None = None, succeed_after: str = "3s",
                config_map: str = "resnet50-onnx") -> dict[str, Any]:
    spec: dict[str, Any] = {
        "model": {"onnx": {"configMapKeyRef": {"name": config_map, "key": "model.onnx"}}},
        "training": {"batchSize": 256, "datasetSize": 1_281_167, "epochs": 1},
        "objective": {"prefer": prefer, "deadline": deadline, "maxGpus": max_gpus},
        "template": {"metadata": {"annotations": {"testbed.io/succeed-after": succeed_after}},
                     "spec": {"containers": [{"name": "trainer", "image": "trainer:test"}]}},
    }
    if gpu_types:
        spec["gpuTypes"] = gpu_types
    return {"apiVersion": f"{G}/{V}", "kind": "TrainingJob", "metadata": {"name": name},
            "spec": spec}


class TrainingJobs:
    def __init__(self, api_client: Any, namespace: str) -> None:
        self.api = client.CustomObjectsApi(api_client)
        self.ns = namespace

    def create(self, body: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = self.api.create_namespaced_custom_object(
            G, V, self.ns, P, body, _request_timeout=30)
        return out

    def get(self, name: str) -> dict[str, Any]:
        out: dict[str, Any] = self.api.get_namespaced_custom_object(
            G, V, self.ns, P, name, _request_timeout=30)
        return out

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.api.patch_namespaced_custom_object(G, V, self.ns, P, name, {"spec": spec},
                                                _request_timeout=30)

    def delete(self, name: str) -> None:
        self.api.delete_namespaced_custom_object(G, V, self.ns, P, name, _request_timeout=30)

    def condition(self, name: str, type_: str) -> dict[str, Any] | None:
        for c in self.get(name).get("status", {}).get("conditions", []):
            if c["type"] == type_:
                return dict(c)
        return None


def jobs_of(batch_v1: Any, namespace: str, tj: str) -> list[Any]:
    return list(batch_v1.list_namespaced_job(
        namespace, label_selector=f"gpuplan.io/trainingjob={tj}", _request_timeout=30).items)


@contextlib.contextmanager
def tainted_gpu_node(core_v1: Any, namespace: str, pool: dict[str, Any], *,
                     labels: dict[str, str] | None = None) -> Iterator[Callable[[], None]]:
    """Yields `add`, which creates one kwok node of `pool` (testbed/nodes.yaml's pool schema,
    `count` 1) when called; deleted on exit. Tainted for `namespace`, so no pod of another
    session sharing the testbed lands on it; `labels` are added to the node's."""
    import testbed_render

    [node] = testbed_render.node_manifests({"kind": "NodePools", "pools": [pool]},
                                           f"{pool['namePrefix']}-node")
    node["metadata"]["labels"].update(labels or {})
    node["spec"] = {"taints": [{"key": "gpuplan.io/test", "value": namespace,
                                "effect": "NoSchedule"}]}
    added: list[str] = []

    def add() -> None:
        core_v1.create_node(node, _request_timeout=30)
        added.append(node["metadata"]["name"])

    try:
        yield add
    finally:
        for name in added:
            core_v1.delete_node(name, _request_timeout=30)
