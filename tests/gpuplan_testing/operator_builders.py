"""kueue-style builders for TrainingJob specs and plans used by the operator unit tests."""

from __future__ import annotations

import base64
import copy
from typing import Any

from gpuplan_operator.core import resources


class SpecBuilder:
    def __init__(self) -> None:
        self._spec: dict[str, Any] = {
            "model": {"onnx": {"configMapKeyRef": {"name": "resnet", "key": "model.onnx"}}},
            "training": {"batchSize": 256, "datasetSize": 1_281_167, "epochs": 1},
            "objective": {"prefer": "cheapest", "deadline": "4h", "maxGpus": 8},
            "template": {"spec": {"containers": [{"name": "trainer", "image": "pytorch:2"}]}},
        }

    def set(self, path: str, value: Any) -> SpecBuilder:
        *parents, leaf = path.split(".")
        node = self._spec
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
        return self

    def drop(self, path: str) -> SpecBuilder:
        *parents, leaf = path.split(".")
        node = self._spec
        for p in parents:
            node = node[p]
        del node[leaf]
        return self

    def obj(self) -> dict[str, Any]:
        return copy.deepcopy(self._spec)


def make_plan(*, gpu_type: str = "NVIDIA-A100-SXM4-80GB", gpu_count: int = 4,
              gpus_per_node: int = 4, nodes: int = 1, estimated_seconds: float = 3600.0,
              generation: int = 1) -> resources.StatusPlan:
    return resources.StatusPlan(
        gpu_type=gpu_type, device="a100-sxm4-80gb", gpu_count=gpu_count,
        gpus_per_node=gpus_per_node, nodes=nodes, estimated_seconds=estimated_seconds,
        step_time_ms=120.5, memory_bytes_per_gpu=30 * 2**30, cost_usd=12.5,
        predictor="lightgbm", observed_generation=generation,
    )


class LocalServer:
    """A real aiohttp server on 127.0.0.1 with a random port, for client tests."""

    def __init__(self, app: Any, ssl_context: Any = None) -> None:
        from aiohttp import web

        self._runner = web.AppRunner(app)
        self._ssl = ssl_context  # an ssl.SSLContext serves https
        self.url = ""

    async def __aenter__(self) -> LocalServer:
        from aiohttp import web

        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=self._ssl)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"{'https' if self._ssl is not None else 'http'}://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


class SchedulingKubeMixin:
    """The `kube.Kube` calls of quotas, scheduler opt-in, gangs and FailedCreate (issue #32)
    for a unit test's fake kube: a cluster without quotas, labels or PodGroup APIs unless a
    test sets them."""

    quotas: list[dict[str, Any]]
    namespace_labels: dict[str, str]
    served_groups: list[str]
    podgroups: dict[str, dict[str, Any]]
    job_objects: dict[str, dict[str, Any]]

    def init_scheduling(self) -> None:
        self.quotas, self.namespace_labels, self.served_groups = [], {}, ["batch/v1"]
        self.podgroups, self.job_objects = {}, {}

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        return list(self.quotas)

    async def get_namespace_labels(self, name: str) -> dict[str, str]:
        return dict(self.namespace_labels)

    async def served_api_groups(self) -> list[str]:
        return list(self.served_groups)

    async def create_podgroup(self, group: str, version: str, namespace: str,
                              body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        name = body["metadata"]["name"]
        created = name not in self.podgroups
        self.podgroups.setdefault(name, body)
        return self.podgroups[name], created

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.job_objects.get(name)


class PlanningKube(SchedulingKubeMixin):
    """A fake `kube.Kube` for a whole reconcile pass: one model ConfigMap, `nodes`, no pods;
    the TrainingJob's status and created Jobs in dicts (`tj_reads` counts its reads)."""

    def __init__(self, nodes: list[dict[str, Any]]) -> None:
        self.init_scheduling()
        self.status: dict[str, Any] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.nodes = nodes
        self.tj_reads = 0

    async def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return {"metadata": {"name": name},
                "binaryData": {"model.onnx": base64.b64encode(b"\x08\x07").decode()}}

    async def list_gpu_nodes(self) -> list[dict[str, Any]]:
        return list(self.nodes)

    async def list_active_pods(self) -> list[dict[str, Any]]:
        return []

    async def get_service_account(self, namespace: str, name: str) -> dict[str, Any]:
        return {"metadata": {"name": name}}

    async def list_job_pods(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        return []

    async def patch_trainingjob_status(self, namespace: str, name: str,
                                       status: dict[str, Any]) -> dict[str, Any]:
        self.status.update(status)
        return {}

    async def patch_trainingjob_annotations(self, namespace: str, name: str,
                                            annotations: dict[str, str]) -> dict[str, Any]:
        return {}

    async def get_trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.tj_reads += 1
        return {"metadata": {"name": name, "uid": "uid-1", "generation": 1},
                "status": dict(self.status)}

    async def create_job(self, namespace: str,
                         body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        self.jobs[body["metadata"]["name"]] = body
        return body, True

    async def create_service(self, namespace: str,
                             body: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        return body, True


def no_feasible_plan() -> Any:
    """The estimator's 422 answer when no candidate fits (an aiohttp `web.Response`)."""
    from aiohttp import web

    return web.json_response({"error": {"reason": "NoFeasiblePlan",
                                        "message": "no candidate meets the deadline"}},
                             status=422)
