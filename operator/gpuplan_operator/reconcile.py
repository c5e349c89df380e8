"""Orchestration of one TrainingJob: plan, annotate, launch, record the outcome.

No kopf here: handlers pass the object, a clock and an event sink, and map the domain errors
this module raises to kopf's retry semantics. Status is written before the next side effect so
a restarted operator resumes from it (plan before Job, Job before `Launched`).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gpuplan_operator import (
    errors,
    estimator_client,
    inventory,
    kube,
    manifests,
    metrics,
    modelsource,
    resources,
    settings,
    tracking,
    validation,
)
from gpuplan_operator.resources import ConditionType as Condition
from gpuplan_operator.resources import Reason


class EventSink(Protocol):
    """Emits a Kubernetes Event about the object being reconciled."""

    def __call__(self, *, warning: bool, reason: str, message: str) -> None:
        """Emit one Event: type Warning when `warning`, else Normal."""


@dataclasses.dataclass
class Context:
    """What a reconcile pass needs: cluster, settings, metrics, clock and model URL guard."""

    kube: kube.Kube
    settings: settings.Settings
    metrics: metrics.OperatorMetrics
    clock: Callable[[], datetime.datetime]
    guard: modelsource.UrlGuard


@dataclasses.dataclass
class TrainingJobRef:
    """The object being reconciled plus the conditions written so far in this pass."""

    namespace: str
    name: str
    uid: str
    generation: int
    status: dict[str, Any]
    emit: EventSink

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
        await _record_late_change(ctx, tj)
        return
    try:
        parsed = validation.parse_spec(spec)
        plan = _current_plan(tj) or await _plan(ctx, tj, parsed)
    except errors.OperatorError as exc:
        await _fail_estimate(ctx, tj, exc)
        raise
    await _launch(ctx, tj, parsed, plan)


def _current_plan(tj: TrainingJobRef) -> resources.Plan | None:
    stored = tj.status.get("plan")
    if not stored or not resources.is_true(tj.conditions, Condition.ESTIMATED):
        return None
    plan = resources.Plan.from_status(stored)
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
        cm = await ctx.kube.get_config_map(tj.namespace, ref.config_map_name)
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


async def _plan(ctx: Context, tj: TrainingJobRef,
                spec: resources.TrainingJobSpec) -> resources.Plan:
    model = await _load_model(ctx, tj, spec.model)
    pools = inventory.build_inventory(await ctx.kube.list_gpu_nodes(),
                                      await ctx.kube.list_active_pods())
    body = estimator_client.build_request(spec, model, pools)
    try:
        plan = await estimator_client.request_plan(
            ctx.settings.estimator_url, body, generation=tj.generation,
            timeout_seconds=ctx.settings.estimator_timeout_seconds)
    except errors.OperatorError as exc:
        ctx.metrics.count_request(exc.reason)
        raise
    ctx.metrics.count_request("ok")
    message = (f"{plan.gpu_count}x {plan.gpu_type} ({plan.nodes} node(s)), "
               f"estimated {plan.estimated_seconds:.0f}s, predictor {plan.predictor}")
    await _set(ctx, tj, type_=Condition.ESTIMATED, ok=True, reason=Reason.PLANNED, message=message,
               extra={"plan": plan.to_status()})
    await ctx.kube.patch_trainingjob_annotations(tj.namespace, tj.name,
                                                 manifests.plan_annotations(plan))
    ctx.metrics.observe_plan(tj.namespace, tj.name, plan.gpu_type, plan.estimated_seconds)
    tj.emit(warning=False, reason=Reason.PLANNED, message=message)
    return plan


async def _launch(ctx: Context, tj: TrainingJobRef, spec: resources.TrainingJobSpec,
                  plan: resources.Plan) -> None:
    owner = manifests.Owner(name=tj.name, uid=tj.uid)
    port = ctx.settings.master_port
    if plan.multi_node:
        svc = manifests.build_headless_service(owner=owner, namespace=tj.namespace,
                                               master_port=port)
        await ctx.kube.create_service(tj.namespace, svc)
    job = manifests.build_job(owner=owner, namespace=tj.namespace, plan=plan,
                              template=spec.template, scheduler_name=ctx.settings.scheduler_name,
                              master_port=port)
    existing, created = await ctx.kube.create_job(tj.namespace, job)
    owners = [o.get("uid") for o in existing["metadata"].get("ownerReferences") or []]
    name = job["metadata"]["name"]
    if tj.uid not in owners:
        exc = errors.JobNameConflictError(f"job {name} exists and is not owned by this TrainingJob")
        await _set(ctx, tj, type_=Condition.LAUNCHED, ok=False, reason=exc.reason, message=str(exc))
        raise exc
    message = f"Job {name}: {plan.gpu_count}x {plan.gpu_type}"
    await _set(ctx, tj, type_=Condition.LAUNCHED, ok=True, reason=Reason.JOB_CREATED,
               message=message, extra={"jobName": name})
    if created:
        tj.emit(warning=False, reason=Reason.JOB_CREATED, message=message)


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
    """Copy a finished Job's outcome into its TrainingJob once (status.actual, drift, metrics)."""
    outcome = tracking.job_outcome(job)
    if outcome is None:
        return
    meta = job["metadata"]
    tj_name = (meta.get("labels") or {}).get(resources.OWNER_LABEL)
    if not tj_name:
        return
    body = await ctx.kube.get_trainingjob(meta["namespace"], tj_name)
    if body is None:
        return
    status = dict(body.get("status") or {})
    if status.get("actual") or status.get("jobName") != meta["name"]:
        return
    plan = resources.Plan.from_status(status["plan"])
    drift = resources.drift_ratio(outcome.actual.seconds, plan.estimated_seconds)
    tj = TrainingJobRef(meta["namespace"], tj_name, body["metadata"]["uid"],
                        int(body["metadata"].get("generation", 1)), status, emit_for(body))
    extra: dict[str, Any] = {"actual": outcome.actual.to_status()}
    if drift is not None:
        extra["drift"] = round(drift, 6)
    type_, reason = ((Condition.SUCCEEDED, Reason.JOB_COMPLETED) if outcome.succeeded
                     else (Condition.FAILED, Reason.JOB_FAILED))
    message = f"{outcome.message}; {outcome.actual.seconds:.0f}s actual, drift {drift}"
    await _set(ctx, tj, type_=type_, ok=True, reason=reason, message=message, extra=extra)
    ctx.metrics.observe_finished(tj.namespace, tj.name, plan.gpu_type, outcome.actual.seconds,
                                 drift)
    tj.emit(warning=not outcome.succeeded, reason=reason, message=message)
    if outcome.succeeded and outcome.actual.seconds > 0:
        await _feed_back(ctx, tj, plan, outcome.actual.seconds)


async def _feed_back(ctx: Context, tj: TrainingJobRef, plan: resources.Plan,
                     actual_seconds: float) -> None:
    """Send the outcome to the estimator as a calibration sample; losing one is not fatal."""
    body = estimator_client.build_outcome(job_uid=tj.uid, plan=plan,
                                          actual_seconds=actual_seconds)
    try:
        await estimator_client.report_outcome(
            ctx.settings.estimator_url, body,
            timeout_seconds=ctx.settings.estimator_timeout_seconds)
    except errors.EstimatorUnavailableError as exc:
        tj.emit(warning=True, reason="OutcomeNotRecorded", message=str(exc))
