"""Orchestration of one TrainingJob: plan, annotate, launch, record the outcome.

No kopf here: handlers pass the object, a clock and an event sink, and map the domain errors
this module raises to kopf's retry semantics. Status is written before the next side effect so
a restarted operator resumes from it (plan before Job, Job before `Launched`), and every pass
completes what the observed state lacks (annotations of a stored plan, its Job) instead of
trusting that an earlier pass got that far: a crash between two writes leaves nothing undone.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpuplan_operator import estimator_client, kube, metrics, modelsource
from gpuplan_operator.core import (
    coalescing,
    errors,
    gangs,
    gpu_pools,
    kueue,
    manifests,
    quotas,
    resources,
    settings,
    throttling,
    tracking,
    validation,
)
from gpuplan_operator.core.resources import ConditionType as Condition
from gpuplan_operator.core.resources import Reason

REPORTED_UIDS_KEPT = 10_000
"""How many job uids whose outcome was sent are remembered (a bounded guard against resends)."""
INVENTORY_MAX_AGE_S = 1.0
"""How stale the node and pod lists behind a plan may be; within it concurrent plans share
one read of each (the extender places pods from its own, current view)."""


class EventSink(Protocol):
    """Emits a Kubernetes Event about the object being reconciled."""

    def __call__(self, *, warning: bool, reason: str, message: str) -> None:
        """Emit one Event: type Warning when `warning`, else Normal."""


@dataclasses.dataclass
class Context:
    """What a reconcile pass needs: cluster, settings, metrics, clock and model URL guard,
    plus in-memory state shared by passes (lost on restart, when resume handlers rebuild it)."""

    kube: kube.Kube
    settings: settings.Settings
    metrics: metrics.OperatorMetrics
    clock: Callable[[], datetime.datetime]
    guard: modelsource.UrlGuard
    pod_namespaces: tuple[str, ...] = ()
    """Namespaces whose pods count in the GPU inventory; empty: every namespace. A namespaced
    operator lists only its own (issue #33), so its free-GPU counts miss other namespaces'
    pods, which the scheduler still sees."""
    infeasible_at: dict[str, gpu_pools.Capacity] = dataclasses.field(default_factory=dict)
    """TrainingJob uid → the GPU capacity its plan was infeasible for."""
    excluded_nodes: dict[str, str] = dataclasses.field(default_factory=dict)
    """Nodes of the latest inventory whose shared GPUs plans leave out, with why."""
    capacity: coalescing.Coalesced[gpu_pools.Capacity] = dataclasses.field(init=False)
    """The cluster's GPU capacity, re-read at most once per capacity_check_interval_seconds
    for all TrainingJobs."""
    reported: collections.OrderedDict[str, None] = dataclasses.field(
        default_factory=collections.OrderedDict)
    """Job uids whose outcome was sent to the estimator, oldest first."""
    started: set[str] = dataclasses.field(default_factory=set)
    """Uids of running Jobs whose first container start is already in their TrainingJob."""
    admitted: dict[str, bool] = dataclasses.field(default_factory=dict)
    """Uids of queued (Kueue) Jobs → whether the TrainingJob's Queued condition says admitted,
    so a Job's further events do not re-read its TrainingJob."""
    gpu_pools: coalescing.Coalesced[list[gpu_pools.ClusterGpuPool]] = dataclasses.field(init=False)
    """The GPU pools of the latest node and pod lists, shared by concurrent plans."""

    config_maps: coalescing.CoalescedByKey[tuple[str, str], dict[str, Any] | None] = (
        dataclasses.field(init=False))
    fetches: throttling.NamespaceSlots = dataclasses.field(init=False)
    """Plans holding a model in memory, bounded in all and per namespace (issue #33)."""
    """Model ConfigMaps by (namespace, name): TrainingJobs applied together from one model
    share one read."""

    def __post_init__(self) -> None:
        def seconds() -> float:
            return self.clock().timestamp()
        self.capacity = coalescing.Coalesced(self.settings.capacity_check_interval_seconds,
                                             clock=seconds)
        self.gpu_pools = coalescing.Coalesced(INVENTORY_MAX_AGE_S, clock=seconds)
        self.config_maps = coalescing.CoalescedByKey(INVENTORY_MAX_AGE_S, clock=seconds)
        self.fetches = throttling.NamespaceSlots(throttling.SlotLimits(
            self.settings.model_fetches, self.settings.model_fetches_per_namespace))


@dataclasses.dataclass
class TrainingJobRef:
    """The object being reconciled plus the conditions written so far in this pass."""

    namespace: str
    name: str
    uid: str
    generation: int
    status: dict[str, Any]
    emit: EventSink
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """The object's annotations as observed; an empty mapping only means more patches."""

    @property
    def conditions(self) -> list[dict[str, Any]]:
        """The conditions written so far (a copy)."""
        return list(self.status.get("conditions") or [])


async def _set(ctx: Context, tj: TrainingJobRef, *, type_: str, ok: bool, reason: str,
               message: str, extra: Mapping[str, Any] | None = None) -> None:
    conditions = resources.set_condition(
        tj.conditions, type_=type_, status=ok, reason=reason, message=message,
        observed_generation=tj.generation, now=ctx.clock())
    patch = {"conditions": conditions, "observedGeneration": tj.generation, **(extra or {})}
    await ctx.kube.patch_trainingjob_status(tj.namespace, tj.name, patch)
    tj.status.update(patch)


async def reconcile(ctx: Context, tj: TrainingJobRef, spec: Mapping[str, Any]) -> None:
    """Plan (unless a plan for this generation exists) and launch; idempotent."""
    if tj.status.get("jobName"):
        stored = tj.status.get("plan")
        if stored:
            await _ensure_annotations(ctx, tj, resources.StatusPlan.from_status(stored))
        await _record_late_change(ctx, tj)
        return
    if awaits_capacity(tj.status, tj.generation) and not await _capacity_changed(ctx, tj):
        raise errors.AwaitingCapacityError(
            "no plan was feasible and GPU types and node counts are unchanged since")
    try:
        parsed = validation.parse_spec(spec)
        plan = _current_plan(tj) or await _plan(ctx, tj, parsed)
    except errors.ModelFetchesBusyError:
        raise  # retried soon; a condition per retry would only load the API server
    except errors.OperatorError as exc:
        await _fail_estimate(ctx, tj, exc)
        raise
    ctx.infeasible_at.pop(tj.uid, None)
    await _ensure_annotations(ctx, tj, plan)
    await _launch(ctx, tj, parsed, plan)


async def _ensure_annotations(ctx: Context, tj: TrainingJobRef, plan: resources.StatusPlan) -> None:
    """Write the plan's annotations unless the object already carries them (a pass that
    crashed after storing the plan left them out)."""
    wanted = manifests.plan_annotations(plan)
    if all(tj.annotations.get(k) == v for k, v in wanted.items()):
        return
    await ctx.kube.patch_trainingjob_annotations(tj.namespace, tj.name, wanted)
    tj.annotations = {**tj.annotations, **wanted}


def awaits_capacity(status: Mapping[str, Any], generation: int) -> bool:
    """Whether the TrainingJob's current generation stopped at NoFeasiblePlan, unlaunched."""
    if status.get("jobName"):
        return False
    cond = resources.find_condition(status.get("conditions") or [], Condition.ESTIMATED)
    return (cond is not None and cond.get("status") == "False"
            and cond.get("reason") == Reason.NO_FEASIBLE_PLAN
            and cond.get("observedGeneration") == generation)


async def current_capacity(ctx: Context) -> gpu_pools.Capacity:
    """The cluster's GPU capacity, listed at most once per capacity_check_interval_seconds."""
    return await ctx.capacity.get(lambda: _read_capacity(ctx))


async def _read_capacity(ctx: Context) -> gpu_pools.Capacity:
    return gpu_pools.capacity(gpu_pools.build_inventory(await ctx.kube.list_gpu_nodes(), []))


async def _capacity_changed(ctx: Context, tj: TrainingJobRef) -> bool:
    """Whether GPU nodes were added or removed since this TrainingJob's plan was infeasible.

    Unknown (the plan failed before this process started) counts as changed: one re-plan
    records the capacity it failed for.
    """
    seen = ctx.infeasible_at.get(tj.uid)
    if seen is None:
        return True
    if seen == await current_capacity(ctx):
        return False
    tj.emit(warning=False, reason=Reason.CAPACITY_CHANGED,
            message="GPU capacity changed since no plan was feasible: re-planning")
    return True


def _current_plan(tj: TrainingJobRef) -> resources.StatusPlan | None:
    stored = tj.status.get("plan")
    if not stored or not resources.is_true(tj.conditions, Condition.ESTIMATED):
        return None
    plan = resources.StatusPlan.from_status(stored)
    return plan if plan.observed_generation == tj.generation else None


async def _fail_estimate(ctx: Context, tj: TrainingJobRef, exc: errors.OperatorError) -> None:
    message = str(exc)
    # NoFeasiblePlan's details are the rejections, one per GPU type; a field error's details
    # repeat its message.
    if (isinstance(exc, errors.EstimatorRejectedError) and exc.details
            and exc.reason == "NoFeasiblePlan"):
        message = f"{message}: {estimator_client.describe_rejections(exc.details)}"
    await _set(ctx, tj, type_=Condition.ESTIMATED, ok=False, reason=exc.reason, message=message)
    tj.emit(warning=True, reason=exc.reason, message=message)


async def _load_model(ctx: Context, tj: TrainingJobRef, ref: resources.ModelRef) -> bytes:
    s = ctx.settings
    if ref.url is not None:
        data = await modelsource.fetch_url(ref.url, guard=ctx.guard, max_bytes=s.model_max_bytes,
                                           timeout_seconds=s.model_fetch_timeout_seconds)
    else:
        assert ref.config_map_name is not None and ref.config_map_key is not None
        name = ref.config_map_name
        cm = await ctx.config_maps.get(
            (tj.namespace, name), lambda: ctx.kube.get_config_map(tj.namespace, name))
        if cm is None:
            # Often applied in the same file right after the TrainingJob: wait, don't fail.
            raise errors.ModelSourceUnavailableError(
                f"configmap {tj.namespace}/{ref.config_map_name} not found")
        data = modelsource.from_config_map(cm, ref.config_map_key, s.model_max_bytes)
    if ref.hf_config:
        modelsource.check_hf_config(data, f"configmap {ref.config_map_name}/{ref.config_map_key}")
    else:
        modelsource.check_format(data, ref.format)
    return data


async def _read_gpu_pools(ctx: Context) -> list[gpu_pools.ClusterGpuPool]:
    listing = (ctx.kube.list_active_pods_in(ctx.pod_namespaces) if ctx.pod_namespaces
               else ctx.kube.list_active_pods())
    nodes, pods = await asyncio.gather(ctx.kube.list_gpu_nodes(), listing)
    ctx.excluded_nodes = gpu_pools.excluded_nodes(nodes)
    return list(gpu_pools.build_inventory(nodes, pods))


async def _quota_capped(ctx: Context, tj: TrainingJobRef, spec: resources.TrainingJobSpec
                        ) -> tuple[resources.TrainingJobSpec, quotas.QuotaRoom]:
    """`spec` with `objective.maxGpus` lowered to the room the namespace's ResourceQuotas
    leave; QuotaExceededError when they leave no GPU or no Job."""
    room = quotas.quota_room(await ctx.kube.list_resource_quotas(tj.namespace))
    if room.gpus == 0 or room.jobs == 0:
        raise errors.QuotaExceededError(f"no plan fits the namespace's quota: {room.describe()}")
    capped = quotas.capped_max_gpus(spec.objective.max_gpus, room)
    if capped == spec.objective.max_gpus:
        return spec, room
    objective = dataclasses.replace(spec.objective, max_gpus=capped)
    return dataclasses.replace(spec, objective=objective), room


async def _plan(ctx: Context, tj: TrainingJobRef,
                spec: resources.TrainingJobSpec) -> resources.StatusPlan:
    """Plan while holding one of the namespace's fetch slots: the model is in memory from its
    fetch to the estimator's answer (issue #33)."""
    async with ctx.fetches.take(tj.namespace):
        return await _plan_holding_model(ctx, tj, spec)


async def _plan_holding_model(ctx: Context, tj: TrainingJobRef,
                              spec: resources.TrainingJobSpec) -> resources.StatusPlan:
    model = await _load_model(ctx, tj, spec.model)
    pools = await ctx.gpu_pools.get(lambda: _read_gpu_pools(ctx))
    quota = None
    if spec.local_queue is not None:
        quota = await _read_queue_quota(ctx, tj.namespace, spec.local_queue)
        pools = _queue_pools(pools, quota)
    asked_gpus = spec.objective.max_gpus
    spec, room = await _quota_capped(ctx, tj, spec)
    capped = spec.objective.max_gpus < asked_gpus
    body = estimator_client.build_request(spec, model, pools)
    del model  # the body holds it now; the request's encoding is the next copy
    try:
        plan = await estimator_client.request_plan(
            ctx.settings.estimator_url, body, generation=tj.generation,
            timeout_seconds=ctx.settings.estimator_timeout_seconds, tenant=tj.namespace,
            token_file=ctx.settings.estimator_token_file,
            ca_file=ctx.settings.estimator_ca_file)
    except errors.OperatorError as exc:
        ctx.metrics.count_request(exc.reason)
        if exc.reason == Reason.NO_FEASIBLE_PLAN and quota is None and not capped:
            # A queued or quota-capped job's feasibility also depends on its quota, which the
            # capacity record does not cover: it re-plans at every capacity check instead.
            ctx.infeasible_at[tj.uid] = gpu_pools.capacity(pools)
        wrapped = _explained(exc, quota, room if capped else None, ctx.excluded_nodes)
        if wrapped is exc:
            raise
        raise wrapped from exc
    ctx.metrics.count_request("ok")
    plan = estimator_client.with_planned_steps(plan, spec.training)
    message = (f"{plan.gpu_count}x {plan.gpu_type} ({plan.nodes} node(s)), "
               f"estimated {plan.estimated_seconds:.0f}s, {plan.predictor_summary()}")
    if plan.setup_summary():
        # The strategy is what the trainer must honour (GPUPLAN_* env) for the plan to fit.
        message += f"; {plan.setup_summary()}"
    if quota is not None:
        message += f"; {quota.name}: {kueue.describe_quota(quota)}"
    if capped:
        message += f"; capped at {spec.objective.max_gpus} GPU(s): {room.describe()}"
    if ctx.excluded_nodes:
        message += f"; {gpu_pools.describe_excluded(ctx.excluded_nodes)}"
    not_fused = plan.attention_warning()
    if not_fused is not None:
        # Asked fused, priced eager: the time and memory are the eager ones, and the user
        # must not read them as fused.
        message += f"; {not_fused}"
    await _set(ctx, tj, type_=Condition.ESTIMATED, ok=True, reason=Reason.PLANNED, message=message,
               extra={"plan": plan.to_status(),
                      "relativeSpeeds": manifests.relative_speeds(plan)})
    ctx.metrics.observe_plan(tj.namespace, tj.name, plan.gpu_type, plan.estimated_seconds)
    tj.emit(warning=False, reason=Reason.PLANNED, message=message)
    if not_fused is not None:
        tj.emit(warning=True, reason=Reason.ATTENTION_NOT_FUSED, message=not_fused)
    return plan


def _explained(exc: errors.OperatorError, queue: kueue.QueueQuota | None,
               room: quotas.QuotaRoom | None, excluded: Mapping[str, str]) -> errors.OperatorError:
    """The estimator's rejection saying which quotas bounded the plan (a Kueue queue's, the
    namespace's ResourceQuota) and which shared GPUs it left out; other errors as they are."""
    if not isinstance(exc, errors.EstimatorRejectedError):
        return exc
    within = [] if queue is None else [queue.name]
    if room is not None:
        within.append(room.describe())
    message = f"within {'; '.join(within)}: {exc}" if within else str(exc)
    if excluded and exc.reason == Reason.NO_FEASIBLE_PLAN:
        message += f" ({gpu_pools.describe_excluded(excluded)})"
    if message == str(exc):
        return exc
    return errors.EstimatorRejectedError(exc.reason, message, exc.details)


async def _read_queue_quota(ctx: Context, namespace: str, name: str) -> kueue.QueueQuota:
    """The GPU quota of LocalQueue `name`'s ClusterQueue, read from Kueue's API."""
    local_queue = await ctx.kube.get_local_queue(namespace, name)
    if local_queue is None:
        raise errors.QueueNotFoundError(
            f"LocalQueue {namespace}/{name} not found (spec.kueue.localQueue; is Kueue "
            "installed?)")
    try:
        cq_name = kueue.cluster_queue_name(local_queue)
    except kueue.QueueError as exc:
        raise errors.QueueNotFoundError(str(exc)) from exc
    cluster_queue, flavors = await asyncio.gather(ctx.kube.get_cluster_queue(cq_name),
                                                  ctx.kube.list_resource_flavors())
    if cluster_queue is None:
        raise errors.QueueNotFoundError(
            f"ClusterQueue {cq_name} of LocalQueue {namespace}/{name} not found")
    return kueue.queue_quota(local_queue, cluster_queue, flavors)


def _queue_pools(pools: list[gpu_pools.ClusterGpuPool],
                 quota: kueue.QueueQuota) -> list[gpu_pools.ClusterGpuPool]:
    """The pools the queue's quota allows; NoQueueQuotaError naming the queue when none."""
    allowed = kueue.restrict_pools(pools, quota)
    if not allowed:
        raise errors.NoQueueQuotaError(kueue.describe_no_gpu_types(quota, pools))
    return allowed


async def _launch(ctx: Context, tj: TrainingJobRef, spec: resources.TrainingJobSpec,
                  plan: resources.StatusPlan) -> None:
    owner = manifests.Owner(name=tj.name, uid=tj.uid)
    port = ctx.settings.master_port
    await _check_service_account(ctx, tj, spec.template)
    placement = await _placement(ctx, tj, spec, plan)
    job = manifests.build_job(owner=owner, namespace=tj.namespace, plan=plan,
                              template=spec.template, master_port=port,
                              local_queue=spec.local_queue, placement=placement)
    name = job["metadata"]["name"]
    try:
        if placement.podgroup is not None:
            await _create_podgroup(ctx, tj, owner, placement.podgroup, job)
        if plan.multi_node:
            svc = manifests.build_headless_service(owner=owner, namespace=tj.namespace,
                                                   master_port=port)
            await ctx.kube.create_service(tj.namespace, svc)
        existing, created = await ctx.kube.create_job(tj.namespace, job)
    except kube.ApiError as exc:
        raise await _launch_rejected(ctx, tj, name, exc) from exc
    owners = [o.get("uid") for o in existing["metadata"].get("ownerReferences") or []]
    if tj.uid not in owners:
        conflict = errors.JobNameConflictError(
            f"job {name} exists and is not owned by this TrainingJob")
        await _set(ctx, tj, type_=Condition.LAUNCHED, ok=False, reason=conflict.reason,
                   message=str(conflict))
        raise conflict
    if spec.local_queue is not None:
        # Before jobName: the Job's events attribute admission to this TrainingJob only once
        # jobName is written, so a fast admission cannot be overwritten by this condition.
        await _set_queued(ctx, tj, existing, spec.local_queue)
    message = f"Job {name}: {plan.gpu_count}x {plan.gpu_type}"
    await _set(ctx, tj, type_=Condition.LAUNCHED, ok=True, reason=Reason.JOB_CREATED,
               message=message, extra={"jobName": name})
    if created:
        tj.emit(warning=False, reason=Reason.JOB_CREATED, message=message)


async def _placement(ctx: Context, tj: TrainingJobRef, spec: resources.TrainingJobSpec,
                     plan: resources.StatusPlan) -> manifests.Placement:
    """Where the pods go (the plan's pool's resource and node labels), which scheduler takes
    them, whether they are one gang, and Kueue's maximum execution time."""
    pools = await ctx.gpu_pools.get(lambda: _read_gpu_pools(ctx))
    pool = next((p for p in pools if p.gpu_type == plan.gpu_type),
                gpu_pools.ClusterGpuPool(plan.gpu_type, plan.gpus_per_node, plan.nodes, 0))
    s = ctx.settings
    template_scheduler = (spec.template.get("spec") or {}).get("schedulerName")
    labels: Mapping[str, str] = {}
    if (s.scheduler_name and pool.extender_places() and s.scheduler_scope != "all"
            and not template_scheduler and spec.gpuplan_scheduler is None):
        labels = await ctx.kube.get_namespace_labels(tj.namespace)
    configured = s.scheduler_name if pool.extender_places() else ""
    scheduler = gangs.scheduler_for(template_scheduler, configured,
                                    scope=s.scheduler_scope, namespace_labels=labels,
                                    tj_opt_in=spec.gpuplan_scheduler)
    podgroup = None
    if plan.multi_node and spec.local_queue is None and s.gang_scheduling == "auto":
        # Kueue admits a queued Job as one Workload already.
        podgroup = gangs.first_served(await ctx.kube.served_api_groups())
    exec_time = (gangs.max_exec_time_s(plan.p90_seconds, s.max_exec_time_margin)
                 if plan.p90_seconds is not None else None)
    return manifests.Placement(gpu_resource=pool.resource, node_labels=pool.node_labels,
                               scheduler_name=scheduler or "", podgroup=podgroup,
                               max_exec_time_s=exec_time)


async def _create_podgroup(ctx: Context, tj: TrainingJobRef, owner: manifests.Owner,
                           api: gangs.PodGroupApi, job: Mapping[str, Any]) -> None:
    """The gang's PodGroup, named as the Job, before the Job creates its pods."""
    meta = job["metadata"]
    pod_meta = job["spec"]["template"].get("metadata") or {}
    body = gangs.build_podgroup(api, name=meta["name"], namespace=tj.namespace,
                                min_member=int(job["spec"]["parallelism"]),
                                queue=gangs.queue_of(api, pod_meta),
                                owner_references=manifests.owner_references(owner),
                                labels={resources.OWNER_LABEL: owner.name})
    _, created = await ctx.kube.create_podgroup(api.group, api.version, tj.namespace, body)
    if created:
        tj.emit(warning=False, reason="PodGroupCreated",
                message=f"{api.scheduler} PodGroup {meta['name']} ({api.group}/{api.version}): "
                        f"all {body['spec']['minMember']} pods are admitted together")


async def _set_queued(ctx: Context, tj: TrainingJobRef, job: Mapping[str, Any],
                      local_queue: str) -> None:
    """The Queued condition from the Job's `suspend`: True while Kueue has not admitted it."""
    name = job["metadata"]["name"]
    if kueue.is_suspended(job):
        await _set(ctx, tj, type_=Condition.QUEUED, ok=True, reason=Reason.WAITING_FOR_ADMISSION,
                   message=f"Job {name} waits for Kueue admission in LocalQueue "
                           f"{tj.namespace}/{local_queue}")
        tj.emit(warning=False, reason=Reason.WAITING_FOR_ADMISSION,
                message=f"Job {name} queued in LocalQueue {local_queue}")
    else:
        await _set(ctx, tj, type_=Condition.QUEUED, ok=False, reason=Reason.ADMITTED,
                   message=f"Kueue admitted Job {name} (LocalQueue {tj.namespace}/{local_queue})")
        tj.emit(warning=False, reason=Reason.ADMITTED,
                message=f"Kueue admitted Job {name} from LocalQueue {local_queue}")


async def _note_admission(ctx: Context, job: Mapping[str, Any], tj_name: str,
                          emit_for: Callable[[Mapping[str, Any]], EventSink]) -> None:
    """Bring the TrainingJob's Queued condition in line with a queued Job's `suspend`: Kueue
    unsuspends on admission and suspends again when it evicts (preemption, pods not ready)."""
    meta = job["metadata"]
    job_uid = str(meta.get("uid", ""))
    admitted = not kueue.is_suspended(job)
    if ctx.admitted.get(job_uid) == admitted:
        return
    body = await ctx.kube.get_trainingjob(meta["namespace"], tj_name)
    if body is None:
        return
    status = dict(body.get("status") or {})
    if status.get("jobName") != meta["name"]:
        return  # not launched yet, or another Job: a later event of this Job comes back here
    tj = TrainingJobRef(meta["namespace"], tj_name, body["metadata"]["uid"],
                        int(body["metadata"].get("generation", 1)), status, emit_for(body))
    queued = resources.find_condition(tj.conditions, Condition.QUEUED)
    says_admitted = queued is not None and queued.get("status") == "False"
    if says_admitted != admitted:
        await _set_queued(ctx, tj, job, str(kueue.queue_of(job)))
    ctx.admitted[job_uid] = admitted


async def _check_service_account(ctx: Context, tj: TrainingJobRef,
                                 template: Mapping[str, Any]) -> None:
    """The account the template names must exist before its pods are created: otherwise the
    Job controller would retry pod creation forever behind a Job that looks launched."""
    account = validation.service_account(template)
    if account is None:
        return  # the namespace's `default`, which the cluster maintains
    if await ctx.kube.get_service_account(tj.namespace, account) is not None:
        return
    exc = errors.ServiceAccountNotFoundError(
        f"spec.template names service account {account!r}, which does not exist in namespace "
        f"{tj.namespace}; no Job is created until it does")
    await _set(ctx, tj, type_=Condition.LAUNCHED, ok=False, reason=exc.reason, message=str(exc))
    tj.emit(warning=True, reason=exc.reason, message=str(exc))
    raise exc


async def _launch_rejected(ctx: Context, tj: TrainingJobRef, job_name: str,
                           exc: kube.ApiError) -> errors.OperatorError:
    """A 4xx from the API server on create: the same object gets the same answer, so the
    condition says why and the pass stops (kube already turned 429 and 5xx into retries).
    A ResourceQuota's refusal is the exception: it lasts only until quota frees up."""
    said = kube.rejection_message(exc)
    message = f"the API server refused Job {job_name} ({exc.status}): {said}"
    rejected: errors.OperatorError = (
        errors.QuotaExceededError(message) if exc.status == 403 and "exceeded quota" in said
        else errors.JobRejectedError(int(exc.status or 0), message))
    await _set(ctx, tj, type_=Condition.LAUNCHED, ok=False, reason=rejected.reason,
               message=message)
    tj.emit(warning=True, reason=rejected.reason, message=message)
    return rejected


async def _record_late_change(ctx: Context, tj: TrainingJobRef) -> None:
    plan = tj.status.get("plan") or {}
    if plan.get("observedGeneration") == tj.generation:
        return  # a resume of an already launched job: nothing to do
    if (resources.find_condition(tj.conditions, Condition.SPEC_CHANGED) or {}).get(
            "observedGeneration") == tj.generation:
        return
    message = (f"spec changed (generation {tj.generation}) after Job {tj.status['jobName']} "
               f"was launched from generation {plan.get('observedGeneration')}; the running Job "
               "is kept, re-create the TrainingJob to re-plan")
    await _set(ctx, tj, type_=Condition.SPEC_CHANGED, ok=True, reason=Reason.SPEC_CHANGE_IGNORED,
               message=message)
    tj.emit(warning=True, reason=Reason.SPEC_CHANGE_IGNORED, message=message)


async def record_job(ctx: Context, job: Mapping[str, Any], emit_for: Callable[
        [Mapping[str, Any]], EventSink]) -> None:
    """Copy a finished Job's outcome into its TrainingJob once (status.actual, drift, metrics).

    While the Job runs, the first container start is noted in `status.actual.startTime`: a
    finished pod's own record of it may be gone (replaced after a disruption, deleted) or, in
    some runtimes, rewritten at termination. Drift is actual / estimated for succeeded runs
    only, the run measured from that first container start; a failed run says nothing about
    the estimate.
    """
    meta = job["metadata"]
    tj_name = (meta.get("labels") or {}).get(resources.OWNER_LABEL)
    if not tj_name:
        return
    finished = tracking.job_outcome(job) is not None
    job_uid = str(meta.get("uid", ""))
    if kueue.queue_of(job) is not None and not finished:
        await _note_admission(ctx, job, tj_name, emit_for)
    if not finished and (job_uid in ctx.started or not _has_pods(job)):
        return  # nothing new to learn from a running Job's event
    body = await ctx.kube.get_trainingjob(meta["namespace"], tj_name)
    if body is None:
        return
    status = dict(body.get("status") or {})
    actual = status.get("actual") or {}
    if actual.get("completionTime") or status.get("jobName") != meta["name"]:
        return
    pods = await ctx.kube.list_job_pods(meta["namespace"], job_uid)
    noted = resources.parse_time(actual["startTime"]) if actual.get("startTime") else None
    if not finished:
        await _pods_created(ctx, TrainingJobRef(
            meta["namespace"], tj_name, body["metadata"]["uid"],
            int(body["metadata"].get("generation", 1)), status, emit_for(body)), meta["name"])
        await _note_start(ctx, meta["namespace"], tj_name, job_uid, noted, pods)
        return
    outcome = tracking.job_outcome(job, pods, observed_start=noted)
    assert outcome is not None  # finished above; pods only refine its start
    plan = resources.StatusPlan.from_status(status["plan"])
    # Issue #33: only an uninterrupted run measures training, timed from its attempt's start.
    drift = (resources.drift_ratio(outcome.training_seconds, plan.estimated_seconds)
             if outcome.measures_training else None)
    tj = TrainingJobRef(meta["namespace"], tj_name, body["metadata"]["uid"],
                        int(body["metadata"].get("generation", 1)), status, emit_for(body))
    extra: dict[str, Any] = {"actual": outcome.actual.to_status()}
    if drift is not None:
        extra["drift"] = round(drift, 6)
    type_, reason = ((Condition.SUCCEEDED, Reason.JOB_COMPLETED) if outcome.succeeded
                     else (Condition.FAILED, Reason.JOB_FAILED))
    measured = f"{outcome.actual.seconds:.0f}s actual from the {outcome.start_source}"
    if outcome.interruptions:
        measured += (f"; interrupted ({', '.join(outcome.interruptions)}): not used for "
                     "calibration or drift")
    elif outcome.attempt_start is not None and drift is not None:
        measured += f", {outcome.training_seconds:.0f}s in the attempt that finished"
    message = (f"{outcome.message}; {measured}, drift {drift:.3g}" if drift is not None
               else f"{outcome.message}; {measured}")
    await _set(ctx, tj, type_=type_, ok=True, reason=reason, message=message, extra=extra)
    ctx.started.discard(job_uid)
    ctx.admitted.pop(job_uid, None)
    now = ctx.clock()
    ctx.metrics.expire(now, ctx.settings.finished_job_metrics_seconds)
    ctx.metrics.observe_finished(tj.namespace, tj.name, plan.gpu_type, outcome.actual.seconds,
                                 drift, succeeded=outcome.succeeded, now=now)
    tj.emit(warning=not outcome.succeeded, reason=reason, message=message)
    if outcome.measures_training and outcome.training_seconds > 0:
        await _feed_back(ctx, tj, plan, outcome.training_seconds)


async def record_failed_create(ctx: Context, namespace: str, job_name: str, message: str,
                               emit_for: Callable[[Mapping[str, Any]], EventSink]) -> None:
    """The Job controller's FailedCreate of a launched Job as `Launched` False on its
    TrainingJob (reason PodsNotCreated, the API server's words): a Job whose pods a quota
    refuses is not running. A later Job event with pods sets it back (`_pods_created`)."""
    job = await ctx.kube.get_job(namespace, job_name)
    tj_name = ((job or {}).get("metadata", {}).get("labels") or {}).get(resources.OWNER_LABEL)
    if job is None or not tj_name or _has_pods(job):
        return
    body = await ctx.kube.get_trainingjob(namespace, tj_name)
    if body is None or (body.get("status") or {}).get("jobName") != job_name:
        return
    tj = TrainingJobRef(namespace, tj_name, body["metadata"]["uid"],
                        int(body["metadata"].get("generation", 1)), dict(body["status"]),
                        emit_for(body))
    said = f"Job {job_name} could not create its pods: {message}"
    launched = resources.find_condition(tj.conditions, Condition.LAUNCHED) or {}
    if launched.get("reason") == Reason.PODS_NOT_CREATED and launched.get("message") == said:
        return
    await _set(ctx, tj, type_=Condition.LAUNCHED, ok=False, reason=Reason.PODS_NOT_CREATED,
               message=said)
    tj.emit(warning=True, reason=Reason.PODS_NOT_CREATED, message=said)


async def _pods_created(ctx: Context, tj: TrainingJobRef, job_name: str) -> None:
    """`Launched` back to True once a Job that could not create its pods has some."""
    launched = resources.find_condition(tj.conditions, Condition.LAUNCHED) or {}
    if launched.get("reason") != Reason.PODS_NOT_CREATED:
        return
    message = f"Job {job_name}: its pods were created"
    await _set(ctx, tj, type_=Condition.LAUNCHED, ok=True, reason=Reason.JOB_CREATED,
               message=message)
    tj.emit(warning=False, reason=Reason.JOB_CREATED, message=message)


def _has_pods(job: Mapping[str, Any]) -> bool:
    status = job.get("status") or {}
    return any(int(status.get(k) or 0) > 0 for k in ("active", "ready", "succeeded", "failed"))


async def _note_start(ctx: Context, namespace: str, tj_name: str, job_uid: str,
                      noted: datetime.datetime | None,
                      pods: list[dict[str, Any]]) -> None:
    """Write the running Job's first container start into status.actual.startTime (once)."""
    start = tracking.first_container_start(pods)
    if start is None:
        return  # pods not started yet: a later Job event (ready count) comes back here
    ctx.started.add(job_uid)
    if noted is not None and noted <= start:
        return
    await ctx.kube.patch_trainingjob_status(
        namespace, tj_name, {"actual": {"startTime": resources.format_time(start)}})


def forget(ctx: Context, namespace: str, name: str, uid: str) -> None:
    """Drop what the operator keeps about a deleted TrainingJob (gauges, capacity record)."""
    ctx.metrics.forget(namespace, name)
    ctx.infeasible_at.pop(uid, None)


async def _feed_back(ctx: Context, tj: TrainingJobRef, plan: resources.StatusPlan,
                     actual_seconds: float) -> None:
    """Send the outcome to the estimator as a calibration sample, at most once per job uid
    (status.actual, written first, guards restarts; `ctx.reported` guards racing events).
    Transient failures are retried within `outcome_report_seconds`; losing one after that is
    not fatal, and says why in an OutcomeNotRecorded event."""
    if tj.uid in ctx.reported:
        return
    ctx.reported[tj.uid] = None
    while len(ctx.reported) > REPORTED_UIDS_KEPT:
        ctx.reported.popitem(last=False)
    body = estimator_client.build_outcome(job_uid=tj.uid, plan=plan,
                                          actual_seconds=actual_seconds, namespace=tj.namespace)
    try:
        await estimator_client.report_outcome(
            ctx.settings.estimator_url, body,
            timeout_seconds=ctx.settings.estimator_timeout_seconds,
            deadline_seconds=ctx.settings.outcome_report_seconds,
            token_file=ctx.settings.estimator_token_file,
            ca_file=ctx.settings.estimator_ca_file)
    except errors.EstimatorUnavailableError as exc:
        tj.emit(warning=True, reason="OutcomeNotRecorded", message=str(exc))
