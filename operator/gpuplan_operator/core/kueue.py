"""Pure: Kueue's LocalQueue → ClusterQueue → ResourceFlavors → the GPU types a queue can run.

A TrainingJob that names a LocalQueue is planned only among the GPU types whose
ResourceFlavors carry `nvidia.com/gpu` nominal quota in that queue's ClusterQueue, and for no
more GPUs of a type than that quota: Kueue would never admit a larger Job. A flavor names its
GPU type by the GPU Feature Discovery label in its `spec.nodeLabels`; Kueue copies those labels
into the admitted pods' node selector, so a flavor without that label could place the pods on
any GPU type and says nothing the plan can rely on.

The objects are plain dicts as the API returns them (kueue.x-k8s.io/v1beta2, Kueue >= 0.15).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuplan_operator.core import gpu_accounting, gpu_pools

GROUP = "kueue.x-k8s.io"
VERSION = "v1beta2"
LOCAL_QUEUES = "localqueues"
CLUSTER_QUEUES = "clusterqueues"
RESOURCE_FLAVORS = "resourceflavors"
QUEUE_NAME_LABEL = "kueue.x-k8s.io/queue-name"
"""The label by which Kueue's Job integration finds a Job's LocalQueue."""


class QueueError(ValueError):
    """A Kueue object is missing a field the plan needs (the message names it)."""


@dataclasses.dataclass(frozen=True)
class FlavorQuota:
    """One ResourceFlavor of the ClusterQueue that gives GPUs of one type."""

    flavor: str
    gpu_type: str
    nominal_gpus: int
    used_gpus: int
    """GPUs of this flavor that admitted workloads hold (the ClusterQueue's flavorsReservation)."""

    @property
    def left_gpus(self) -> int:
        """Nominal quota not held by admitted workloads (borrowed GPUs can exceed it)."""
        return max(self.nominal_gpus - self.used_gpus, 0)


@dataclasses.dataclass(frozen=True)
class QueueQuota:
    """What a LocalQueue's ClusterQueue offers in GPUs, per flavor, and why others give none."""

    namespace: str
    local_queue: str
    cluster_queue: str
    flavors: tuple[FlavorQuota, ...]
    """Flavors with `nvidia.com/gpu` nominal quota > 0 and a GPU product node label."""
    ignored: tuple[str, ...]
    """One line per ClusterQueue flavor left out: `<flavor>: <why>`."""

    @property
    def name(self) -> str:
        """The queue as users name it: `LocalQueue <ns>/<name> (ClusterQueue <cq>)`."""
        return (f"LocalQueue {self.namespace}/{self.local_queue} "
                f"(ClusterQueue {self.cluster_queue})")

    def nominal_gpus_by_type(self) -> dict[str, int]:
        """Nominal GPU quota per GPU type, summed over the flavors of that type."""
        out: dict[str, int] = {}
        for f in self.flavors:
            out[f.gpu_type] = out.get(f.gpu_type, 0) + f.nominal_gpus
        return out

    def left_gpus_by_type(self) -> dict[str, int]:
        """Nominal GPU quota not held by admitted workloads, per GPU type."""
        out: dict[str, int] = {}
        for f in self.flavors:
            out[f.gpu_type] = out.get(f.gpu_type, 0) + f.left_gpus
        return out


def cluster_queue_name(local_queue: Mapping[str, Any]) -> str:
    """The ClusterQueue a LocalQueue points at; QueueError when it names none."""
    name = (local_queue.get("spec") or {}).get("clusterQueue")
    if not isinstance(name, str) or not name:
        meta = local_queue.get("metadata") or {}
        raise QueueError(f"LocalQueue {meta.get('namespace')}/{meta.get('name')} names no "
                         "spec.clusterQueue")
    return name


def queue_quota(local_queue: Mapping[str, Any], cluster_queue: Mapping[str, Any],
                flavors: Iterable[Mapping[str, Any]]) -> QueueQuota:
    """The GPU flavors of `cluster_queue` with quota, from its spec and the flavors' node labels.

    `flavors` are the cluster's ResourceFlavors (any superset of those the ClusterQueue names).
    """
    by_name = {str((f.get("metadata") or {}).get("name")): f for f in flavors}
    reserved = _reserved_gpus(cluster_queue)
    usable: list[FlavorQuota] = []
    ignored: list[str] = []
    for flavor_name, quota in _gpu_quota_by_flavor(cluster_queue, ignored):
        flavor = by_name.get(flavor_name)
        if flavor is None:
            ignored.append(f"{flavor_name}: ResourceFlavor not found")
            continue
        labels = (flavor.get("spec") or {}).get("nodeLabels") or {}
        gpu_type = labels.get(gpu_accounting.GPU_PRODUCT_LABEL)
        if not gpu_type:
            ignored.append(f"{flavor_name}: no {gpu_accounting.GPU_PRODUCT_LABEL} in nodeLabels")
            continue
        if quota <= 0:
            ignored.append(f"{flavor_name}: no {gpu_accounting.GPU_RESOURCE} nominal quota")
            continue
        usable.append(FlavorQuota(flavor_name, str(gpu_type), quota,
                                  reserved.get(flavor_name, 0)))
    meta = local_queue.get("metadata") or {}
    return QueueQuota(namespace=str(meta.get("namespace", "")),
                      local_queue=str(meta.get("name", "")),
                      cluster_queue=cluster_queue_name(local_queue), flavors=tuple(usable),
                      ignored=tuple(ignored))


def _gpu_quota_by_flavor(cluster_queue: Mapping[str, Any],
                         ignored: list[str]) -> list[tuple[str, int]]:
    """(flavor, nominal GPUs) for every flavor of a resource group covering `nvidia.com/gpu`.

    A flavor in a group that does not cover GPUs is not listed: it can never hold a GPU pod.
    A quantity that is not a whole number of GPUs is reported in `ignored`.
    """
    out: list[tuple[str, int]] = []
    for group in (cluster_queue.get("spec") or {}).get("resourceGroups") or []:
        if gpu_accounting.GPU_RESOURCE not in (group.get("coveredResources") or []):
            continue
        for flavor in group.get("flavors") or []:
            name = str(flavor.get("name", ""))
            quota = next((r.get("nominalQuota") for r in flavor.get("resources") or []
                          if r.get("name") == gpu_accounting.GPU_RESOURCE), 0)
            try:
                out.append((name, gpu_accounting.parse_gpu_quantity(quota)))
            except gpu_accounting.QuantityError as exc:
                ignored.append(f"{name}: {exc}")
    return out


def _reserved_gpus(cluster_queue: Mapping[str, Any]) -> dict[str, int]:
    """GPUs per flavor held by workloads with quota reserved (status.flavorsReservation)."""
    out: dict[str, int] = {}
    for flavor in (cluster_queue.get("status") or {}).get("flavorsReservation") or []:
        for res in flavor.get("resources") or []:
            if res.get("name") != gpu_accounting.GPU_RESOURCE:
                continue
            try:
                out[str(flavor.get("name"))] = gpu_accounting.parse_gpu_quantity(
                    res.get("total", 0))
            except gpu_accounting.QuantityError:
                continue  # usage only shapes a message; the quota itself was parsed above
    return out


def restrict_pools(pools: Sequence[gpu_pools.ClusterGpuPool],
                   quota: QueueQuota) -> list[gpu_pools.ClusterGpuPool]:
    """The pools of the queue's GPU types, each cut to at most the type's nominal quota.

    The estimator offers a type up to gpus_per_node x nodes GPUs, so the cut is in whole
    nodes; a quota below one node becomes one node of `quota` GPUs (a pod asking for fewer
    GPUs than its node has still fits there).
    """
    nominal = quota.nominal_gpus_by_type()
    out: list[gpu_pools.ClusterGpuPool] = []
    for pool in pools:
        gpus = nominal.get(pool.gpu_type, 0)
        if gpus <= 0:
            continue
        if gpus < pool.gpus_per_node:
            out.append(dataclasses.replace(pool, gpus_per_node=gpus, nodes=1,
                                           free_gpus=min(pool.free_gpus, gpus)))
            continue
        nodes = min(pool.nodes, gpus // pool.gpus_per_node)
        out.append(dataclasses.replace(pool, nodes=nodes,
                                       free_gpus=min(pool.free_gpus, nodes * pool.gpus_per_node)))
    return out


def describe_no_gpu_types(quota: QueueQuota, pools: Sequence[gpu_pools.ClusterGpuPool]) -> str:
    """Why a queue leaves the planner nothing: its flavors, the cluster's types, what was left
    out. The message of NoFeasiblePlan, so it names the queue."""
    offered = quota.nominal_gpus_by_type()
    cluster = sorted({p.gpu_type for p in pools})
    parts = [f"{quota.name} has no {gpu_accounting.GPU_RESOURCE} quota for a GPU type of the "
             f"cluster ({', '.join(cluster) or 'no GPU nodes'})"]
    if offered:
        parts.append("quota for " + ", ".join(f"{t} ({n})" for t, n in sorted(offered.items())))
    if quota.ignored:
        parts.append("flavors left out: " + "; ".join(quota.ignored))
    return "; ".join(parts)


def describe_quota(quota: QueueQuota) -> str:
    """`<type> <left>/<nominal> GPUs left` per GPU type of the queue (the Queued message)."""
    left = quota.left_gpus_by_type()
    return ", ".join(f"{t} {left.get(t, 0)}/{n} GPUs left"
                     for t, n in sorted(quota.nominal_gpus_by_type().items()))


def is_suspended(job: Mapping[str, Any]) -> bool:
    """Whether a Job is suspended (created so for Kueue; Kueue clears it on admission)."""
    return bool((job.get("spec") or {}).get("suspend"))


def queue_of(job: Mapping[str, Any]) -> str | None:
    """The LocalQueue a Job is labelled for, or None."""
    labels = (job.get("metadata") or {}).get("labels") or {}
    name = labels.get(QUEUE_NAME_LABEL)
    return str(name) if name else None
