"""kopf handlers for TrainingJobs and their Jobs: unpack, call `reconcile`, map errors.

Run as a file (`kopf run --standalone path/to/handlers.py`) or via `gpuplan-operator`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import os
import secrets
import socket
from collections.abc import Callable, Mapping
from typing import Any, cast

import kopf
import prometheus_client

from gpuplan_estimator import devices
from gpuplan_operator import benchmark_loop, kube, leases, metrics, modelsource, reconcile
from gpuplan_operator.core import benchmarks, errors, resources
from gpuplan_operator.core import settings as operator_settings

LOG = logging.getLogger(__name__)
TRAINING_JOBS = (resources.GROUP, resources.VERSION, resources.PLURAL)
# Domain errors worth retrying: the world may change (estimator back, ConfigMap created).
TEMPORARY = (errors.EstimatorUnavailableError, errors.ModelSourceUnavailableError,
             errors.JobNameConflictError, errors.ServiceAccountNotFoundError,
             errors.KubeApiUnavailableError, errors.QueueNotFoundError)


JOB_EVENT_ATTEMPTS = 5


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    """Configure kopf; build the reconcile context; start metrics and the benchmark loop."""
    # Progress lives in annotations: status belongs to the CRD's schema, which prunes status.kopf.
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="gpuplan.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix="gpuplan.io")
    settings.watching.server_timeout = 60
    settings.watching.client_timeout = 90
    cfg = operator_settings.Settings.from_env().validate()
    # Bounded concurrency (issue #33): kopf otherwise starts a worker per object at once.
    settings.batching.worker_limit = cfg.worker_limit
    registry = prometheus_client.CollectorRegistry()
    memo.registry = registry
    memo.ctx = reconcile.Context(
        kube=kube.Kube.from_environment(), settings=cfg, metrics=metrics.OperatorMetrics(registry),
        clock=_now, guard=modelsource.UrlGuard.from_cidrs(
            block_private=cfg.model_url_block_private, cidrs=cfg.model_url_allowed_networks),
        pod_namespaces=pod_namespaces(os.environ))
    memo.metrics_server = metrics.serve(registry, cfg.metrics_port)
    leading = _start_lease(memo, cfg)
    memo.benchmark_task = asyncio.create_task(benchmark_loop.run_forever(benchmark_loop.LoopContext(
        kube=memo.ctx.kube, settings=cfg, metrics=memo.ctx.metrics, clock=_now,
        resolve=benchmarks.catalog_resolver(devices.load_catalog()), leading=leading)))
    LOG.info("gpuplan operator started: estimator %s, scheduler %r",
                cfg.estimator_url, cfg.scheduler_name or "default")


def pod_namespaces(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The namespaces whose pods a namespaced operator lists (GPUPLAN_NAMESPACES); () for
    every namespace, also when one is a glob (a pattern cannot be listed)."""
    names = tuple(operator_settings.env_namespaces(environ))
    return () if any(c in n for n in names for c in "*?[") else names


def _start_lease(memo: kopf.Memo, cfg: operator_settings.Settings) -> Callable[[], bool]:
    """Start keeping the leader Lease when one is configured; what says whether we lead."""
    if not cfg.leader_lease_name:
        return lambda: True
    keeper = leases.LeaseKeeper(
        memo.ctx.kube, namespace=cfg.leader_lease_namespace, name=cfg.leader_lease_name,
        me=f"{socket.gethostname()}-{secrets.token_hex(4)}",
        duration_s=cfg.leader_lease_seconds, clock=_now)
    memo.lease_task = asyncio.create_task(keeper.run_forever())
    return lambda: keeper.leading


@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    """kopf's own connection, from the same configuration as `kube` (one source of truth)."""
    config = kube.load_configuration()
    header = config.get_api_key_with_prefix("BearerToken") or config.get_api_key_with_prefix(
        "authorization")
    scheme, _sep, token = (header or "").rpartition(" ")
    return kopf.ConnectionInfo(
        server=config.host, ca_path=config.ssl_ca_cert, insecure=not config.verify_ssl,
        username=config.username or None, password=config.password or None,
        scheme=scheme or None, token=token or None, certificate_path=config.cert_file,
        private_key_path=config.key_file)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    """Stop the benchmark loop and the metrics server."""
    for name in ("benchmark_task", "lease_task"):
        task = memo.get(name)
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    server = memo.get("metrics_server")
    if server is not None:
        server.shutdown()
        server.server_close()


def _emitter(body: Mapping[str, Any]) -> reconcile.EventSink:
    def emit(*, warning: bool, reason: str, message: str) -> None:
        kopf.event(cast(kopf.Body, body), type="Warning" if warning else "Normal", reason=reason,
                   message=message[:1024])
    return emit


@kopf.on.resume(*TRAINING_JOBS)
@kopf.on.create(*TRAINING_JOBS)
@kopf.on.update(*TRAINING_JOBS, field="spec")
async def plan_and_launch(body: kopf.Body, spec: kopf.Spec, meta: kopf.Meta, status: kopf.Status,
                          retry: int, memo: kopf.Memo, **_: Any) -> None:
    """Plan a TrainingJob and launch its Job; domain errors become kopf's retry semantics."""
    ctx: reconcile.Context = memo.ctx
    tj = reconcile.TrainingJobRef(
        namespace=str(meta["namespace"]), name=str(meta["name"]), uid=str(meta["uid"]),
        generation=int(meta.get("generation", 1)), status=dict(status), emit=_emitter(body),
        annotations=dict(meta.get("annotations") or {}))
    try:
        await reconcile.reconcile(ctx, tj, dict(spec))
    except errors.OperatorError as exc:
        raise _kopf_error(ctx, exc, retry) from exc
    except kube.ApiError as exc:
        # A 4xx outside Job creation (e.g. RBAC on a read): nothing to put in a condition
        # that the log does not say better; retry with backoff rather than every minute.
        raise kopf.TemporaryError(f"Kubernetes API answered {exc.status}: "
                                  f"{kube.rejection_message(exc)}",
                                  delay=ctx.settings.retry_delay_seconds(retry)) from exc


def _kopf_error(ctx: reconcile.Context, exc: errors.OperatorError,
                retry: int) -> kopf.TemporaryError | kopf.PermanentError:
    if exc.reason == resources.Reason.NO_FEASIBLE_PLAN or isinstance(
            exc, errors.QuotaExceededError):
        # Not permanent, but not soon either: the next pass re-plans once GPU nodes were added
        # or removed (otherwise it only re-reads the shared, cached node list), or tries the
        # Job again under the namespace's quota.
        return kopf.TemporaryError(str(exc), delay=ctx.settings.capacity_check_interval_seconds)
    if isinstance(exc, TEMPORARY):
        return kopf.TemporaryError(str(exc), delay=ctx.settings.retry_delay_seconds(retry))
    return kopf.PermanentError(f"{exc.reason}: {exc}")


@kopf.on.event(*TRAINING_JOBS)
async def trainingjob_event(event: kopf.RawEvent, memo: kopf.Memo, **_: Any) -> None:
    """Forget a deleted TrainingJob: its per-job gauges and capacity record."""
    if event["type"] != "DELETED":
        return
    meta = event["object"].get("metadata") or {}
    reconcile.forget(memo.ctx, str(meta.get("namespace")), str(meta.get("name")),
                     str(meta.get("uid")))


@kopf.on.event("batch", "v1", "jobs", labels={resources.OWNER_LABEL: kopf.PRESENT})
async def job_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """Copy the outcome of a Job the operator launched into its TrainingJob."""
    ctx: reconcile.Context = memo.ctx
    # kopf never retries event handlers, and a finished Job may send no further event: retry
    # an unavailable API here (a restart lists every Job again, so nothing is lost for good).
    for attempt in range(JOB_EVENT_ATTEMPTS):
        try:
            await reconcile.record_job(ctx, dict(body), _emitter)
            return
        except errors.KubeApiUnavailableError as exc:
            LOG.warning("recording Job %s: %s", body.get("metadata", {}).get("name"), exc)
            await asyncio.sleep(ctx.settings.retry_delay_seconds(attempt))


@kopf.on.event("", "v1", "events", field="reason", value="FailedCreate")
async def job_failed_create(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A Job the operator launched could not create its pods (quota, admission): its
    TrainingJob says so in `Launched` instead of claiming the Job runs."""
    involved = body.get("involvedObject") or {}
    if involved.get("kind") != "Job" or not involved.get("name"):
        return
    try:
        await reconcile.record_failed_create(
            memo.ctx, str(involved.get("namespace")), str(involved["name"]),
            str(body.get("message", "")), _emitter)
    except errors.KubeApiUnavailableError as exc:
        # The Job controller retries with backoff and records each failure again.
        LOG.warning("recording FailedCreate of Job %s: %s", involved["name"], exc)
