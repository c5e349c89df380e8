"""Pure builders of the Kubernetes objects a planned TrainingJob launches (plain dicts)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

from gpuplan_operator.core import annotations as plan_keys
from gpuplan_operator.core import gangs, gpu_accounting, kueue, resources

# Pods of an Indexed Job are named <job>-<index>-<5 random> and use <job>-<index> as hostname
# (a 63-char DNS label), so the Job name leaves room for both.
MAX_JOB_NAME = 52
JOB_SUFFIX = "-train"
COMPLETION_INDEX_FIELD = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"
JOB_BACKOFF_LIMIT = 3
"""Pod failures a Job absorbs before it fails. Disruptions (preemption, eviction, node drain)
do not count (podFailurePolicy Ignore) and a trainer's own non-zero exit fails the Job at
once (FailJob), so this only covers failures neither rule recognises, e.g. a pod that could
not start or a sidecar's crash."""


@dataclasses.dataclass(frozen=True)
class Owner:
    """The TrainingJob that owns everything built here (garbage collection by kcm)."""

    name: str
    uid: str
    api_version: str = f"{resources.GROUP}/{resources.VERSION}"
    kind: str = resources.KIND


def job_name(tj_name: str) -> str:
    """Deterministic DNS-1035 name `<tj>-train`; long names are truncated and hashed."""
    base = re.sub(r"[^a-z0-9-]", "-", tj_name.lower())
    if not base[:1].isalpha():
        base = "tj-" + base
    full = base + JOB_SUFFIX
    if len(full) <= MAX_JOB_NAME and base == tj_name:
        return full
    digest = hashlib.sha256(tj_name.encode()).hexdigest()[:8]
    keep = MAX_JOB_NAME - len(JOB_SUFFIX) - len(digest) - 1
    return f"{base[:keep].rstrip('-')}-{digest}{JOB_SUFFIX}"


def plan_annotations(plan: resources.StatusPlan, *, per_pod: bool = False) -> dict[str, str]:
    """The plan as annotations: GPU type, GPU count and estimated seconds.

    On the TrainingJob and Job the count is the total; on pods (`per_pod`) it is the pod's own
    share (the extender's contract, `annotations.GPU_COUNT`).
    """
    count = plan.gpus_per_node if per_pod else plan.gpu_count
    out = {
        plan_keys.GPU_TYPE: plan.gpu_type,
        plan_keys.GPU_COUNT: str(count),
        plan_keys.ESTIMATED_SECONDS: f"{plan.estimated_seconds:.0f}",
    }
    if not per_pod:
        out[gangs.RELATIVE_SPEED_ANNOTATION] = json.dumps(relative_speeds(plan),
                                                          separators=(",", ":"))
    return out


def relative_speeds(plan: resources.StatusPlan) -> dict[str, float]:
    """`gangs.relative_speeds` of the plan and its alternatives."""
    return gangs.relative_speeds(plan.gpu_type, plan.estimated_seconds, plan.alternatives)


@dataclasses.dataclass(frozen=True)
class Placement:
    """How the Job's pods reach the plan's GPUs and which scheduler admits them."""

    gpu_resource: str = gpu_accounting.GPU_RESOURCE
    """The resource the trainer requests (`nvidia.com/mig-<profile>` on mixed MIG nodes)."""
    node_labels: tuple[tuple[str, str], ...] = ()
    """Node labels the pods require; empty: the GFD product label is the plan's GPU type."""
    scheduler_name: str = ""
    """schedulerName to set when the template names none; empty leaves the default."""
    podgroup: gangs.PodGroupApi | None = None
    """The gang scheduler whose PodGroup (named as the Job) the pods join; None for none."""
    max_exec_time_s: int | None = None
    """Kueue's maximum execution time label of the Job; None for none."""


def owner_references(owner: Owner) -> list[dict[str, Any]]:
    """ownerReferences that make `owner` the controller, so the object is deleted with it."""
    return [{
        "apiVersion": owner.api_version, "kind": owner.kind, "name": owner.name,
        "uid": owner.uid, "controller": True, "blockOwnerDeletion": True,
    }]


def build_job(
    *, owner: Owner, namespace: str, plan: resources.StatusPlan, template: Mapping[str, Any],
    scheduler_name: str = "", master_port: int = 29500, local_queue: str | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """batch/v1 Job running `template` on the planned GPU type and count.

    With `local_queue` the Job is created suspended and labelled for Kueue, which unsuspends
    it on admission. Suspended from creation, not by Kueue's webhook: a Job that started
    unsuspended could create pods before the webhook (if installed at all) had seen it. A
    multi-node plan is one Indexed Job whose pods are one Kueue PodSet of `nodes` pods, so
    admission reserves quota for all of them or none.
    """
    name = job_name(owner.name)
    placed = placement or Placement(scheduler_name=scheduler_name)
    pod = _pod_template(owner, plan, template, placed)
    if placed.podgroup is not None:
        gangs.join_podgroup(placed.podgroup, pod["metadata"], name)
    spec: dict[str, Any] = {
        "backoffLimit": JOB_BACKOFF_LIMIT,
        "podFailurePolicy": pod_failure_policy(pod["spec"]["containers"][0]["name"]),
        "template": pod,
    }
    if plan.multi_node:
        spec.update(completions=plan.nodes, parallelism=plan.nodes, completionMode="Indexed")
        pod["spec"]["subdomain"] = name
        extra = _distributed_env(name, namespace, plan, master_port)
    else:
        spec.update(completions=1, parallelism=1)
        extra = []
    for container in pod["spec"]["containers"]:
        _set_env(container, _plan_env(plan) + extra)
    labels = {resources.OWNER_LABEL: owner.name}
    if local_queue is not None:
        spec["suspend"] = True
        labels[kueue.QUEUE_NAME_LABEL] = local_queue
    if placed.max_exec_time_s is not None:
        labels[gangs.MAX_EXEC_TIME_LABEL] = str(placed.max_exec_time_s)
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": labels,
            "annotations": plan_annotations(plan),
            "ownerReferences": owner_references(owner),
        },
        "spec": spec,
    }


def pod_failure_policy(trainer: str) -> dict[str, Any]:
    """Retry infrastructure failures, fail fast on the trainer's own errors.

    Rules apply in order: a pod the cluster disrupted (DisruptionTarget: preemption, eviction,
    node drain or shutdown) is replaced without counting toward backoffLimit; a non-zero exit
    of the training container fails the Job at once, since re-running the same code on the
    same data fails again after burning GPU hours. Kubernetes requires restartPolicy Never.
    """
    return {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]},
        {"action": "FailJob",
         "onExitCodes": {"containerName": trainer, "operator": "NotIn", "values": [0]}},
    ]}


def build_headless_service(
    *, owner: Owner, namespace: str, master_port: int = 29500
) -> dict[str, Any]:
    """Headless Service giving Indexed Job pods stable DNS names (<job>-<i>.<service>)."""
    name = job_name(owner.name)
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {resources.OWNER_LABEL: owner.name},
            "ownerReferences": owner_references(owner),
        },
        "spec": {
            "clusterIP": "None",
            # Rendezvous happens before any trainer is Ready.
            "publishNotReadyAddresses": True,
            "selector": {JOB_NAME_LABEL: name},
            "ports": [{"name": "rendezvous", "port": master_port, "targetPort": master_port}],
        },
    }


def _pod_template(owner: Owner, plan: resources.StatusPlan, template: Mapping[str, Any],
                  placement: Placement) -> dict[str, Any]:
    pod = copy.deepcopy(dict(template))
    meta = pod.setdefault("metadata", {})
    meta.setdefault("labels", {})[resources.OWNER_LABEL] = owner.name
    meta.setdefault("annotations", {}).update(plan_annotations(plan, per_pod=True))
    spec = pod.setdefault("spec", {})
    # podFailurePolicy requires Never; validation refuses any other value in the template.
    spec["restartPolicy"] = "Never"
    if placement.scheduler_name and not spec.get("schedulerName"):
        # A tenant's scheduler (KAI, Volcano, HAMi's) is kept: only an unset one is filled.
        spec["schedulerName"] = placement.scheduler_name
    labels = placement.node_labels or ((gpu_accounting.GPU_PRODUCT_LABEL, plan.gpu_type),)
    spec["affinity"] = _with_gpu_affinity(spec.get("affinity") or {}, labels)
    _set_gpu_limit(spec["containers"][0], plan.gpus_per_node, placement.gpu_resource)
    return pod


def _with_gpu_affinity(affinity: Mapping[str, Any],
                       labels: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    """AND the GPU-type requirements into every node selector term (terms are ORed)."""
    out = copy.deepcopy(dict(affinity))
    node = out.setdefault("nodeAffinity", {})
    required = node.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    ours = {gpu_accounting.GPU_PRODUCT_LABEL, *(key for key, _ in labels)}
    requirements = [{"key": key, "operator": "In", "values": [value]} for key, value in labels]
    for term in terms:
        exprs = [e for e in term.get("matchExpressions", []) if e.get("key") not in ours]
        term["matchExpressions"] = [*exprs, *requirements]
    required["nodeSelectorTerms"] = terms
    return out


def _set_gpu_limit(container: dict[str, Any], gpus: int, resource: str) -> None:
    res = container.setdefault("resources", {})
    for quantities in (res.setdefault("limits", {}), res.get("requests") or {}):
        # A whole-GPU request beside a MIG instance would also take a whole GPU.
        quantities.pop(gpu_accounting.GPU_RESOURCE, None)
    res["limits"][resource] = str(gpus)
    if "requests" in res:
        # Extended resources must have requests == limits.
        res["requests"][resource] = str(gpus)


def _plan_env(plan: resources.StatusPlan) -> list[dict[str, Any]]:
    return [
        {"name": "GPUPLAN_GPU_TYPE", "value": plan.gpu_type},
        {"name": "GPUPLAN_GPU_COUNT", "value": str(plan.gpu_count)},
        {"name": "GPUPLAN_ESTIMATED_SECONDS", "value": f"{plan.estimated_seconds:.0f}"},
        {"name": "NPROC_PER_NODE", "value": str(plan.gpus_per_node)},
        # torchrun convention: WORLD_SIZE counts processes (one per GPU), NNODES counts pods.
        {"name": "WORLD_SIZE", "value": str(plan.gpu_count)},
        {"name": "NNODES", "value": str(plan.nodes)},
        *setup_env(plan),
    ]


def setup_env(plan: resources.StatusPlan) -> list[dict[str, str]]:
    """How the plan runs, as the trainer's GPUPLAN_* variables (docs/trainingjob.md); only
    what the plan carries (an estimator before issue #19 sends no layout or strategy).

    The plan's memory figures hold only if the trainer honours these: a plan that fits with
    ZeRO-2 and 4x accumulation runs out of memory as plain data parallelism.
    """
    env: dict[str, str] = {}
    if plan.parallelism is not None:
        par = plan.parallelism
        env.update(GPUPLAN_DATA_PARALLEL=str(par.dp), GPUPLAN_TENSOR_PARALLEL=str(par.tp),
                   GPUPLAN_PIPELINE_PARALLEL=str(par.pp),
                   GPUPLAN_MICRO_BATCHES=str(par.micro_batches),
                   GPUPLAN_MICRO_BATCH_SIZE=str(par.micro_batch),
                   GPUPLAN_EXPERT_PARALLEL=str(par.ep))
    if plan.strategy is not None:
        strategy = plan.strategy
        env.update(GPUPLAN_GRADIENT_ACCUMULATION=str(strategy.gradient_accumulation),
                   GPUPLAN_ZERO_STAGE=str(strategy.zero_stage), GPUPLAN_FSDP=strategy.fsdp,
                   GPUPLAN_ACTIVATION_CHECKPOINTING=strategy.checkpointing,
                   GPUPLAN_OFFLOAD_OPTIMIZER=str(strategy.offload_optimizer).lower(),
                   GPUPLAN_MEMORY_STRATEGY=strategy.label)
        if strategy.checkpoint_fraction is not None:
            env["GPUPLAN_CHECKPOINT_FRACTION"] = f"{strategy.checkpoint_fraction:g}"
    return [{"name": name, "value": value} for name, value in env.items()]


def _distributed_env(job: str, namespace: str, plan: resources.StatusPlan,
                     master_port: int) -> list[dict[str, Any]]:
    return [
        {"name": "MASTER_ADDR", "value": f"{job}-0.{job}.{namespace}.svc"},
        {"name": "MASTER_PORT", "value": str(master_port)},
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX_FIELD}}},
    ]


def _set_env(container: dict[str, Any], env: list[dict[str, Any]]) -> None:
    ours = {e["name"] for e in env}
    kept = [e for e in container.get("env", []) if e.get("name") not in ours]
    container["env"] = kept + env
