"""The only module that calls the Kubernetes API. Everything returns plain JSON dicts."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
from collections.abc import Mapping
from typing import Any

import kubernetes
import urllib3
from kubernetes.client.exceptions import ApiException

from gpuplan_operator.core import errors, gpu_accounting, kueue, node_gpus, resources

ApiError = ApiException
"""What the Kubernetes client raises for a 4xx answer; callers catch this, not the client.

Timeouts, refused connections, 429 and 5xx answers are `errors.KubeApiUnavailableError`
instead: worth retrying with backoff, unlike a 4xx.
"""

JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
"""Label the Job controller puts on its pods: the Job's uid (exact, unlike the Job's name)."""

REQUEST_TIMEOUT = (5.0, 30.0)  # (connect, read) seconds on every call
API_THREADS = 32
"""Blocking client calls in flight at once: as many as the client's connection pool, so 50
TrainingJobs applied together do not queue behind asyncio's default of cpu + 4 threads."""
_EXECUTOR = concurrent.futures.ThreadPoolExecutor(max_workers=API_THREADS,
                                                  thread_name_prefix="kube-api")


class Kube:
    """Thin async facade over the `kubernetes` client (blocking calls run in threads)."""

    def __init__(self, api_client: kubernetes.client.ApiClient) -> None:
        self._core = kubernetes.client.CoreV1Api(api_client)
        self._batch = kubernetes.client.BatchV1Api(api_client)
        self._custom = kubernetes.client.CustomObjectsApi(api_client)
        self._apis = kubernetes.client.ApisApi(api_client)
        self._coordination = kubernetes.client.CoordinationV1Api(api_client)

    @classmethod
    def from_environment(cls) -> Kube:
        """A client configured by `load_configuration` (in-cluster, else kubeconfig)."""
        return cls(kubernetes.client.ApiClient(load_configuration()))

    async def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ConfigMap, or None when it does not exist."""
        return await _call_or_none(self._core.read_namespaced_config_map, name, namespace)

    async def list_gpu_nodes(self) -> list[dict[str, Any]]:
        """Nodes carrying GPU Feature Discovery's product label or GKE's accelerator label
        (GKE nodes without GFD); each node once."""
        gfd, gke = await asyncio.gather(
            _call(self._core.list_node, label_selector=gpu_accounting.GPU_PRODUCT_LABEL),
            _call(self._core.list_node, label_selector=node_gpus.GKE_ACCELERATOR_LABEL))
        by_name = {n["metadata"]["name"]: n for n in [*gke.get("items", []),
                                                        *gfd.get("items", [])]}
        return list(by_name.values())

    async def list_active_pods(self) -> list[dict[str, Any]]:
        """Pods of all namespaces that may still hold resources (not Succeeded or Failed)."""
        out = await _call(self._core.list_pod_for_all_namespaces,
                          field_selector=gpu_accounting.ACTIVE_PODS_FIELD_SELECTOR)
        return list(out.get("items", []))

    async def list_active_pods_in(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        """Active pods of `namespaces` only (a namespaced operator, issue #33)."""
        out: list[dict[str, Any]] = []
        for namespace in namespaces:
            found = await _call(self._core.list_namespaced_pod, namespace,
                                field_selector=gpu_accounting.ACTIVE_PODS_FIELD_SELECTOR)
            out.extend(found.get("items", []))
        return out

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The coordination Lease, or None when it does not exist."""
        return await _call_or_none(self._coordination.read_namespaced_lease, name, namespace)

    async def write_lease(self, namespace: str, body: Mapping[str, Any]) -> bool:
        """Create the Lease, or replace it when `body` carries a resourceVersion; False when
        another replica wrote it first (409)."""
        name = body["metadata"]["name"]
        try:
            if body["metadata"].get("resourceVersion"):
                await _call(self._coordination.replace_namespaced_lease, name, namespace,
                            dict(body))
            else:
                await _call(self._coordination.create_namespaced_lease, namespace, dict(body))
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def get_trainingjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The TrainingJob, or None when it does not exist."""
        return await _call_or_none(self._custom.get_namespaced_custom_object, resources.GROUP,
                                   resources.VERSION, namespace, resources.PLURAL, name)

    async def patch_trainingjob_status(self, namespace: str, name: str,
                                       status: Mapping[str, Any]) -> dict[str, Any]:
        """Patch the TrainingJob's status subresource with `status`."""
        return await _call(self._custom.patch_namespaced_custom_object_status, resources.GROUP,
                           resources.VERSION, namespace, resources.PLURAL, name,
                           {"status": dict(status)})

    async def patch_trainingjob_annotations(self, namespace: str, name: str,
                                            annotations: Mapping[str, str]) -> dict[str, Any]:
        """Patch `annotations` onto the TrainingJob; other annotations stay."""
        return await _call(self._custom.patch_namespaced_custom_object, resources.GROUP,
                           resources.VERSION, namespace, resources.PLURAL, name,
                           {"metadata": {"annotations": dict(annotations)}})

    async def get_service_account(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The ServiceAccount, or None when it does not exist."""
        return await _call_or_none(self._core.read_namespaced_service_account, name, namespace)

    async def list_job_pods(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        """Pods the Job controller created for the Job of uid `job_uid`, any phase."""
        out = await _call(self._core.list_namespaced_pod, namespace,
                          label_selector=f"{JOB_UID_LABEL}={job_uid}")
        return list(out.get("items", []))

    async def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Job, or None when it does not exist."""
        return await _call_or_none(self._batch.read_namespaced_job, name, namespace)

    async def list_jobs(self, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """Jobs of `namespace` matching `label_selector`."""
        out = await _call(self._batch.list_namespaced_job, namespace,
                          label_selector=label_selector)
        return list(out.get("items", []))

    async def create_job(self, namespace: str,
                         body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create, or return the existing object of that name; the bool says whether it is new."""
        return await _create(self._batch.create_namespaced_job, self._batch.read_namespaced_job,
                             namespace, body)

    async def get_local_queue(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Kueue's LocalQueue, or None when it (or Kueue's CRD) does not exist."""
        return await _call_or_none(self._custom.get_namespaced_custom_object, kueue.GROUP,
                                   kueue.VERSION, namespace, kueue.LOCAL_QUEUES, name)

    async def get_cluster_queue(self, name: str) -> dict[str, Any] | None:
        """Kueue's ClusterQueue, or None when it does not exist."""
        return await _call_or_none(self._custom.get_cluster_custom_object, kueue.GROUP,
                                   kueue.VERSION, kueue.CLUSTER_QUEUES, name)

    async def list_resource_flavors(self) -> list[dict[str, Any]]:
        """Kueue's ResourceFlavors (cluster-scoped, few: one per node pool)."""
        out = await _call(self._custom.list_cluster_custom_object, kueue.GROUP, kueue.VERSION,
                          kueue.RESOURCE_FLAVORS)
        return list(out.get("items", []))

    async def get_namespace_labels(self, name: str) -> dict[str, str]:
        """The namespace's labels ({} when it is gone)."""
        body = await _call_or_none(self._core.read_namespace, name)
        return dict(((body or {}).get("metadata") or {}).get("labels") or {})

    async def list_resource_quotas(self, namespace: str) -> list[dict[str, Any]]:
        """The namespace's ResourceQuotas (status.used is the API server's own count)."""
        out = await _call(self._core.list_namespaced_resource_quota, namespace)
        return list(out.get("items", []))

    async def served_api_groups(self) -> list[str]:
        """Every `group/version` the API server serves (API discovery of /apis)."""
        out = await _call(self._apis.get_api_versions)
        return [v["groupVersion"] for g in out.get("groups", []) for v in g.get("versions", [])]

    async def create_podgroup(self, group: str, version: str, namespace: str,
                              body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create a gang scheduler's PodGroup, or return the existing one of that name."""
        def create(ns: str, obj: dict[str, Any], **kw: Any) -> Any:
            return self._custom.create_namespaced_custom_object(
                group, version, ns, "podgroups", obj, **kw)

        def read(name: str, ns: str, **kw: Any) -> Any:
            return self._custom.get_namespaced_custom_object(
                group, version, ns, "podgroups", name, **kw)
        return await _create(create, read, namespace, body)

    async def list_job_events(self, namespace: str, job_name: str) -> list[dict[str, Any]]:
        """Events about the Job of that name (the Job controller's FailedCreate among them)."""
        out = await _call(self._core.list_namespaced_event, namespace,
                          field_selector=f"involvedObject.kind=Job,involvedObject.name={job_name}")
        return list(out.get("items", []))

    async def create_service(self, namespace: str,
                             body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
        """Create, or return the existing object of that name; the bool says whether it is new."""
        return await _create(self._core.create_namespaced_service,
                             self._core.read_namespaced_service, namespace, body)


def load_configuration() -> kubernetes.client.Configuration:
    """In-cluster config when running in a pod, else KUBECONFIG / ~/.kube/config."""
    config = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=config)
    except kubernetes.config.ConfigException:
        # The client reads KUBECONFIG at import time; read it now (tests set it later).
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"),
                                           client_configuration=config)
    config.connection_pool_maxsize = API_THREADS
    return config


def rejection_message(exc: ApiException) -> str:
    """The API server's own words for a refused call: the Status `message`, else the reason."""
    try:
        body = json.loads(exc.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str) and body["message"]:
        return str(body["message"])
    return f"{exc.status} {exc.reason}"


async def _call(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    def run() -> dict[str, Any]:
        resp = fn(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        data: dict[str, Any] = json.loads(resp.data)
        return data
    try:
        return await asyncio.get_running_loop().run_in_executor(_EXECUTOR, run)
    except urllib3.exceptions.HTTPError as exc:  # timeouts, refused or reset connections
        raise errors.KubeApiUnavailableError(
            f"Kubernetes API unreachable: {type(exc).__name__}: {exc}") from exc
    except ApiException as exc:
        if exc.status is not None and (exc.status >= 500 or exc.status == 429):
            raise errors.KubeApiUnavailableError(
                f"Kubernetes API answered {exc.status}: {rejection_message(exc)}") from exc
        raise


async def _call_or_none(fn: Any, *args: Any) -> dict[str, Any] | None:
    try:
        return await _call(fn, *args)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


async def _create(create: Any, read: Any, namespace: str,
                  body: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    try:
        return await _call(create, namespace, dict(body)), True
    except ApiException as exc:
        # A restarted operator finds the object it created before: deterministic names make
        # "already exists" the idempotency check.
        if exc.status != 409:
            raise
    return await _call(read, body["metadata"]["name"], namespace), False
