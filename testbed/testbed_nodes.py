"""Kubernetes edge of the testbed: create the fake Nodes of `testbed/nodes.yaml`, wait for Ready."""

from __future__ import annotations

import pathlib
import time
from typing import Any

import yaml
from testbed_common import NODE_LABEL_SELECTOR, TestbedError
from testbed_render import node_manifests

API_TIMEOUT_S = 10  # per request
MAX_NODES_FILE_BYTES = 1 << 20


def load_nodes(path: pathlib.Path) -> list[dict[str, Any]]:
    try:
        if path.stat().st_size > MAX_NODES_FILE_BYTES:
            raise TestbedError(f"{path}: larger than {MAX_NODES_FILE_BYTES} bytes")
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise TestbedError(f"{path}: cannot read node pools ({exc})") from exc
    return node_manifests(doc, str(path))


def core_api(kubeconfig: pathlib.Path) -> Any:
    from kubernetes import client, config  # heavy import, only when the testbed is used

    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    return client.CoreV1Api(api_client)


def create_nodes(kubeconfig: pathlib.Path, nodes: list[dict[str, Any]]) -> int:
    """Create every Node that does not exist yet; returns how many were created."""
    from kubernetes.client.exceptions import ApiException

    api = core_api(kubeconfig)
    created = 0
    try:
        for node in nodes:
            try:
                api.create_node(body=node, _request_timeout=API_TIMEOUT_S)
                created += 1
            except ApiException as exc:
                if exc.status != 409:  # 409: already there from an earlier `up`
                    raise TestbedError(
                        f"creating node {node['metadata']['name']}: {exc.status} {exc.reason}"
                    ) from exc
    finally:
        api.api_client.close()
    return created


def wait_nodes_ready(kubeconfig: pathlib.Path, expected: int, timeout_s: float) -> float:
    """Wait until `expected` testbed nodes report Ready=True (kwok's node-initialize stage)."""
    api = core_api(kubeconfig)
    started = time.monotonic()
    ready: list[str] = []
    try:
        while time.monotonic() - started < timeout_s:
            items = api.list_node(label_selector=NODE_LABEL_SELECTOR,
                                  _request_timeout=API_TIMEOUT_S).items
            ready = [n.metadata.name for n in items if _is_ready(n)]
            if len(ready) >= expected:
                return time.monotonic() - started
            time.sleep(0.5)
    finally:
        api.api_client.close()
    raise TestbedError(f"only {len(ready)}/{expected} fake nodes Ready after {timeout_s:.0f} s; "
                       "is kwok running? see logs/kwok.log")


def _is_ready(node: Any) -> bool:
    conditions = (node.status and node.status.conditions) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)
