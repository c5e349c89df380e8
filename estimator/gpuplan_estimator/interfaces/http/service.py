"""The estimator HTTP service (`gpuplan serve`): aiohttp, because kopf already depends on it.

Handlers are thin and the event loop never touches a client's content: a plan or estimate body
is read as bytes and handed whole to a worker process (`workers`), which decodes, validates and
estimates it and is killed when the request's deadline passes. In front of the workers
(`front`), answers are cached by digest (`caching`), identical requests in flight share one
computation, and a fair queue hands out the workers (`admission`). The model bundle is loaded once
and swapped atomically when a newer one appears (workers follow on their next task). The
calibration from job outcomes is refitted at start-up and after every new outcome, swapped the
same way, and a failed refit keeps the last good one and says so on /metrics. The multi-GPU
scaling model is refitted from the same outcomes with the same lifecycle (issue #19), in the
background after an outcome because a fit with its held-out check takes seconds.

With a performance database, its active model bundle comes first (issue #17): each poll asks the
database for the active version, unpacks a new one into a cache directory keyed by version and
points the cache at it (`models.selection.sync_active_bundle`); the context loader, here and in
every worker, serves what the cache points at (`database_bundle_context`). Every estimate, plan
and coverage answer names the database version (`bundle_version`, null for a file bundle).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
)

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import (
    DatabaseError,
    GpuplanError,
    InvalidRequestError,
    UnknownDeviceError,
)
from gpuplan_estimator.interfaces.http import (
    admission,
    auth,
    caching,
    front,
    openapi,
    wire,
    work,
    workers,
)
from gpuplan_estimator.interfaces.http.metrics import Metrics
from gpuplan_estimator.models import selection
from gpuplan_estimator.planning import calibrating, planner, scaling

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_OUTCOME_BODY_BYTES = 64 * 1024
"""A job outcome is a dozen fields; anything larger is not one."""
WARM_UP_TIMEOUT_S = 300.0
"""How long start-up waits for the workers to import and load the bundle."""


@dataclass(frozen=True)
class ServiceSettings:
    """Listen address, limits and polling interval of the estimator HTTP service."""
    host: str = "0.0.0.0"
    port: int = 8080
    max_body_bytes: int = 64 * 2**20
    """Request body cap; a larger body gets 413."""
    request_timeout_s: float = 60.0
    """Per-request budget, queueing included; past it the worker is killed and the client
    gets 504."""
    bundle_poll_s: float = 30.0
    """How often to look for a newer model bundle (and retry a failed calibration refit)."""
    workers: int = 2
    """Estimation worker processes."""
    tasks_per_worker: int = 200
    """Tasks before a worker is replaced by a fresh one (returns memory a model left behind)."""
    worker_memory_bytes: int = 3 * 2**30
    """Data segment one worker may grow to (`RLIMIT_DATA`), bundle included; a graph needing
    more is answered 422 instead of exhausting the pod."""
    running_per_client: int | None = None
    """Hard cap on one client's running estimates; None: no cap beyond the queue's own rule
    (a client already running never takes the last free worker; `admission`)."""
    queued_per_client: int = 64
    queued_total: int = 512
    cache_entries: int = 512
    cache_bytes: int = 256 * 2**20
    scaling_min_samples: int = scaling.MIN_FIT_SAMPLES
    """Multi-GPU outcomes with scaling fields needed before the scaling model is fitted."""
    scaling_random_state: int = 0
    """Seed of the scaling fit (differential evolution and its held-out folds)."""
    workload_prune_interval_s: float = 3600.0
    """How often the bundle poll also prunes old plan workloads (`WorkloadPruner`)."""


BundleSync = Callable[[], int | None]
"""Brings the bundle cache in line with the database's active bundle; returns its version, or
None when none is active (`models.selection.sync_active_bundle` over a `PerfStore`)."""


BundleActivator = Callable[[int, str], int]
"""Activates a stored bundle version with a reason and returns it; raises LookupError for an
unknown version — `PerfStore.activate`."""


def database_bundle_context(
    cache_dir: str, fallback: work.ContextLoader, prices: Mapping[str, float] | None = None
) -> planner.PlannerContext:
    """The context of the database bundle the cache points at, else `fallback()` (the data-dir
    or shipped bundle). Module-level, so a `functools.partial` of it pickles to the workers."""
    found = selection.select_cached_predictor(Path(cache_dir))
    if found is None:
        return fallback()
    predictor, source = found
    manifest = getattr(getattr(predictor, "bundle", None), "manifest", {}) or {}
    return planner.PlannerContext(
        catalog=devices.load_catalog(price_overrides=prices), predictor=predictor,
        predictor_source=source, manifest=dict(manifest))


class ServiceState:
    """What handlers share: the current planner context and the outcome calibration.

    The context is swapped whole on a new bundle, the calibration and the scaling fitted from
    job outcomes swapped whole on a new outcome; `calibration_generation` counts the swaps of
    either (it keys the answer cache).
    `loader` also builds each worker's context, so it must pickle (`work.ContextLoader`).
    `bundle_sync`, when given, runs before each load: when the database's active version is the
    one in use, the load is skipped (no bundle is re-read every poll).
    """

    def __init__(self, context_loader: work.ContextLoader,
                 bundle_sync: BundleSync | None = None) -> None:
        self.loader = context_loader
        self.bundle_sync = bundle_sync
        self.context: planner.PlannerContext | None = None
        self.calibration = calibrating.Calibration()
        self.calibration_generation = 0
        self.calibration_stale = False
        self.scaling: scaling.FittedScaling = scaling.ANALYTIC
        self.scaling_stale = False

    @property
    def bundle_version(self) -> int | None:
        """The database version of the bundle in use; None for a file bundle or none loaded."""
        context = self.context
        return None if context is None else selection.bundle_version_of(context.predictor_source)

    def load(self) -> bool:
        """(Re)load; returns True when a different bundle is now in use."""
        if self.bundle_sync is not None:
            try:
                active = self.bundle_sync()
            except Exception:  # the database is down: serve what the cache points at
                log.exception("asking the performance database for its active bundle failed")
                if self.context is not None:
                    return False
            else:
                if active is not None and self.context is not None \
                        and active == self.bundle_version:
                    return False
        new = self.loader()
        old = self.context
        if old is not None and old.predictor_source == new.predictor_source:
            return False
        self.context = new  # atomic swap: requests in flight keep the old object
        log.info("using predictor %s", new.predictor_source)
        return True

    def set_calibration(self, fitted: calibrating.Calibration) -> None:
        """Swap in a refitted calibration."""
        self.calibration = fitted
        self.calibration_generation += 1
        self.calibration_stale = False

    def set_scaling(self, fitted: scaling.FittedScaling) -> None:
        """Swap in a refitted scaling model (a new cache generation, like the calibration)."""
        self.scaling = fitted
        self.calibration_generation += 1
        self.scaling_stale = False


def _reply(reply: work.Reply) -> web.Response:
    return web.json_response(reply.body, status=reply.status)


def _json_error(status: int, reason: str, message: str) -> web.Response:
    return _reply(work.error_reply(status, reason, message))


_HTTP_REASONS = {404: "NotFound", 405: "MethodNotAllowed", 413: "RequestTooLarge"}


OutcomeSink = Callable[[wire.OutcomeRequest, str], tuple[int, bool]]
"""Stores a finished job's outcome (with the canonical device key); returns the row id and
whether it is new (False: this job uid was already recorded, nothing changed)."""


OutcomeHistory = Callable[[], Sequence[calibrating.Outcome]]
"""Every stored job outcome, against the model's uncalibrated estimate — `PerfStore`."""


ScalingHistory = Callable[[], Sequence[Mapping[str, Any]]]
"""Every stored job outcome as a record (`PerfStore.job_outcomes`), for the scaling fit."""


WorkloadSink = Callable[[str, bytes, str, int], None]
"""Stores a plan's compressed workload (id, bytes, device key, GPU count) once per id —
`PerfStore.add_workload`."""
WorkloadPruner = Callable[[], int]
"""Deletes plan workloads past their retention that no outcome names; returns how many."""
STORED_WORKLOAD_IDS = 4096
"""Workload ids this replica remembers as stored, so a cached plan answered again does not
write again (the store ignores a repeat anyway; this saves the round trip)."""


CoverageSource = Callable[[], Mapping[str, tuple[int, datetime | None]]]
"""Per device key: (measurement rows, end of the newest finished benchmark run) — `PerfStore`."""


def bundle_heldout_rows(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Per device: held-out rows of the manifest's random-split metrics, over all kernels
    (``metrics[kernel]["random_split_by_device"][device]["rows"]``)."""
    out: dict[str, int] = {}
    metrics = manifest.get("metrics")
    for per_kernel in (metrics.values() if isinstance(metrics, Mapping) else ()):
        by_device = per_kernel.get("random_split_by_device") if isinstance(
            per_kernel, Mapping) else None
        for device, m in (by_device.items() if isinstance(by_device, Mapping) else ()):
            rows = m.get("rows") if isinstance(m, Mapping) else None
            if isinstance(rows, int | float) and not isinstance(rows, bool):
                out[str(device)] = out.get(str(device), 0) + int(rows)
    return out


def bundle_training_rows(manifest: Mapping[str, Any]) -> dict[str, int]:
    """Per device: the rows the bundle was trained on (the manifest's ``device_rows``, written
    by `gpuplan train` since issue #17); bundles from before it fall back to
    `bundle_heldout_rows`, the held-out rows their accuracy for the device rests on."""
    rows = manifest.get("device_rows")
    if not isinstance(rows, Mapping):
        return bundle_heldout_rows(manifest)
    return {str(d): int(n) for d, n in rows.items()
            if isinstance(n, int | float) and not isinstance(n, bool)}


def coverage_json(
    stored: Mapping[str, tuple[int, datetime | None]], bundle_devices: Iterable[str],
    catalog_keys: Iterable[str], *, bundle_rows: Mapping[str, int] | None = None,
    bundle_version: int | None = None,
) -> dict[str, Any]:
    """`GET /v1/coverage`: every catalog, bundle or database device, so absence means 0 rows;
    `bundle_rows` per device from `bundle_training_rows`."""
    in_bundle = set(bundle_devices)
    trained = bundle_rows or {}
    out: dict[str, Any] = {}
    for key in sorted({*catalog_keys, *in_bundle, *stored}):
        rows, newest = stored.get(key, (0, None))
        out[key] = {"measurements": rows,
                    "newest_run_unix": newest.timestamp() if newest is not None else None,
                    "in_bundle": key in in_bundle,
                    "bundle_rows": int(trained.get(key, 0))}
    return {"bundle_version": bundle_version, "devices": out}


def split_workload(document: dict[str, Any]) -> Mapping[str, Any]:
    """Take the worker's workload (`planner.WORKLOAD_KEY`) out of a plan document; {} when it
    has none."""
    found = document.pop(planner.WORKLOAD_KEY, None)
    return found if isinstance(found, Mapping) else {}


def make_app(
    state: ServiceState,
    settings: ServiceSettings = ServiceSettings(),
    registry: CollectorRegistry | None = None,
    outcome_sink: OutcomeSink | None = None,
    coverage_source: CoverageSource | None = None,
    outcome_history: OutcomeHistory | None = None,
    scaling_history: ScalingHistory | None = None,
    bundle_activator: BundleActivator | None = None,
    write_guard: auth.WriteGuard | None = None,
    workload_sink: WorkloadSink | None = None,
    workload_pruner: WorkloadPruner | None = None,
) -> web.Application:
    """The service; without `outcome_history` (no database) predictions stay uncalibrated,
    without `scaling_history` multi-GPU plans use the analytic scaling model, without
    `bundle_activator` the activate endpoint answers 503. `write_guard` decides who may post
    outcomes and activate bundles (issue #16); None leaves writes open (`auth.OPEN`: tests, and
    `gpuplan serve` on loopback, which always passes its own). With `workload_sink`, each plan's
    chosen workload is stored and the plan names it (`workload_id`); without, it is null and the
    workers do not build it. `workload_pruner` runs from the bundle poll every
    `settings.workload_prune_interval_s`."""
    guard = write_guard or auth.WriteGuard(auth.OPEN)
    metrics = Metrics(registry or CollectorRegistry())
    metrics.calibration_stale.set_function(lambda: float(state.calibration_stale))
    metrics.calibration_outcomes.set_function(lambda: state.calibration.overall.outcomes)
    metrics.scaling_samples.set_function(lambda: state.scaling.samples)
    metrics.scaling_fitted.set_function(lambda: float(state.scaling.source == "fitted"))
    metrics.scaling_stale.set_function(lambda: float(state.scaling_stale))
    # Database reads and bundle loads: I/O, bounded by their own timeouts, fine in threads.
    io_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="io")
    front_box: list[front.Front] = []
    # One refit at a time, so a slow earlier read never replaces a newer calibrating.
    refitting = asyncio.Lock()
    refitting_scaling = asyncio.Lock()
    # The background scaling refit, and whether outcomes arrived while it ran (one more then).
    scaling_task: list[asyncio.Task[None]] = []
    scaling_again = [False]
    document = openapi.document()
    stored_workloads: dict[str, None] = {}  # insertion-ordered: the oldest is dropped first

    @web.middleware
    async def envelope(request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every answer is counted, and every failure is the JSON error envelope."""
        start = time.perf_counter()
        resource = request.match_info.route.resource
        endpoint = resource.canonical if resource is not None else "unknown"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            reason = _HTTP_REASONS.get(exc.status, exc.reason.replace(" ", ""))
            message = (f"body exceeds {settings.max_body_bytes} bytes" if exc.status == 413
                       else f"{exc.reason}: {request.method} {request.path[:200]}")
            response = _json_error(exc.status, reason, message)
        except Exception:  # a bug of ours: logged, and still an envelope
            log.exception("unhandled error on %s %s", request.method, request.path[:200])
            response = _json_error(500, "Internal", "internal error; see the service log")
        metrics.requests.labels(endpoint, str(response.status)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        return response

    async def in_threads(fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(io_threads, fn),
                                      timeout=settings.request_timeout_s)

    async def refit_calibration() -> None:
        """Refit from every stored outcome; on any failure keep the calibration in use."""
        if outcome_history is None:
            return
        history = outcome_history
        async with refitting:
            try:
                fitted = await in_threads(lambda: calibrating.fit(history()))
            except Exception:  # the outcome is stored either way; the next poll retries
                log.exception("refitting the calibration from job outcomes failed; keeping the "
                              "current one")
                state.calibration_stale = True
                metrics.refit_failures.inc()
                return
            state.set_calibration(fitted)  # atomic swap, like the bundle
        log.info("calibration from %d job outcomes: %s", fitted.overall.outcomes,
                 calibrating.summary(fitted))

    def fit_scaling(rows: Sequence[Mapping[str, Any]]) -> scaling.FittedScaling:
        return scaling.fit_from_outcomes(
            rows, min_samples=settings.scaling_min_samples,
            random_state=settings.scaling_random_state,
            compute_factor=scaling.single_gpu_compute_factor(rows))

    async def refit_scaling() -> None:
        """Refit the scaling model from every stored outcome; on failure keep the one in use."""
        if scaling_history is None:
            return
        history = scaling_history
        async with refitting_scaling:
            try:
                fitted = await in_threads(lambda: fit_scaling(history()))
            except Exception:  # the outcome is stored either way; the next poll retries
                log.exception("refitting the scaling model from job outcomes failed; keeping "
                              "the current one")
                state.scaling_stale = True
                metrics.scaling_refit_failures.inc()
                return
            state.set_scaling(fitted)
        log.info("scaling model: %s (%s)", fitted.source, fitted.reason)

    async def scaling_refits() -> None:
        while True:
            scaling_again[0] = False
            await refit_scaling()
            if not scaling_again[0]:
                return

    def request_scaling_refit() -> None:
        """Refit in the background; outcomes arriving meanwhile make one more refit, not one
        each (a burst of outcomes must not queue a fit per outcome)."""
        if scaling_task and not scaling_task[0].done():
            scaling_again[0] = True
            return
        scaling_task[:] = [asyncio.create_task(scaling_refits())]

    async def estimation(endpoint: str, request: web.Request) -> web.Response:
        context = state.context
        if context is None or not front_box:
            return _json_error(503, "NotReady", "model bundle not loaded yet")
        deadline = asyncio.get_running_loop().time() + settings.request_timeout_s
        ask = front.Ask(
            endpoint=endpoint, body=await request.read(), bundle=context.predictor_source,
            calibration=state.calibration, calibration_generation=state.calibration_generation,
            scaling_fit=state.scaling,
            client=admission.client_key(request.headers.get(admission.CLIENT_HEADER),
                                        request.remote),
            deadline=deadline)
        found = await front_box[0].answer(ask)
        body = found.body
        if found.status == 200:  # the version of the bundle the workers answered with
            answer = json.loads(body)
            answer["bundle_version"] = selection.bundle_version_of(ask.bundle)
            if endpoint.startswith("plans"):
                answer["workload_id"] = await store_workload(split_workload(answer))
            body = json.dumps(answer).encode("utf-8")
        return web.Response(body=body, status=found.status, content_type="application/json")

    async def store_workload(workload: Mapping[str, Any]) -> str | None:
        """Store the plan's workload (once per id); its id, or None when nothing is stored."""
        workload_id = workload.get("id")
        if workload_sink is None or not isinstance(workload_id, str):
            if "skipped" in workload:
                log.warning("plan workload not kept: %s", workload["skipped"])
            return None
        if workload_id in stored_workloads:
            return workload_id
        sink = workload_sink
        data = base64.b64decode(workload["zstd_b64"])
        try:
            await in_threads(lambda: sink(workload_id, data, str(workload["device"]),
                                          int(workload["gpu_count"])))
        except Exception:  # the plan is answered all the same; only the gate loses this job
            log.exception("storing the plan's workload %s failed", workload_id[:12])
            return None
        stored_workloads[workload_id] = None
        while len(stored_workloads) > STORED_WORKLOAD_IDS:
            del stored_workloads[next(iter(stored_workloads))]
        return workload_id

    async def plans(request: web.Request) -> web.Response:
        return await estimation("plans_with_workload" if workload_sink is not None
                                else "plans", request)

    async def estimate(request: web.Request) -> web.Response:
        return await estimation("estimate", request)

    async def outcomes(request: web.Request) -> web.Response:
        context = state.context
        if outcome_sink is None or context is None:
            return _json_error(503, "NotReady", "no performance database configured")
        body = await request.read()
        if len(body) > MAX_OUTCOME_BODY_BYTES:
            return _json_error(413, "RequestTooLarge",
                               f"a job outcome is at most {MAX_OUTCOME_BODY_BYTES} bytes")
        try:
            data = work.decode_json(body)
        except InvalidRequestError as exc:
            return _json_error(400, "InvalidJSON", str(exc))
        sink = outcome_sink
        try:
            req = wire.parse_outcome_request(data)
            try:
                device = context.catalog.resolve(req.gpu_type).key
            except UnknownDeviceError as exc:
                raise InvalidRequestError("gpu_type", str(exc)) from exc
            row, created = await in_threads(lambda: sink(req, device))
        except InvalidRequestError as exc:
            return _reply(work.invalid_request_reply(exc))
        except DatabaseError as exc:  # logged: the operator retries, but an operator may not
            log.warning("job outcome not stored (503 DatabaseUnavailable): %s", exc)
            return _json_error(503, "DatabaseUnavailable", str(exc))
        except TimeoutError:
            log.warning("job outcome not stored: storing it timed out (504)")
            return _json_error(504, "Timeout", "storing the outcome timed out")
        except GpuplanError as exc:
            return _json_error(422, "InvalidRequest", str(exc))
        if not created:  # the same job reported again: nothing new to learn
            return web.json_response({"id": row, "device": device, "duplicate": True})
        # Before answering, so the plan the operator asks for next already learned from it.
        await refit_calibration()
        request_scaling_refit()
        return web.json_response({"id": row, "device": device, "duplicate": False},
                                 status=201)

    async def coverage(_: web.Request) -> web.Response:
        context = state.context
        if coverage_source is None or context is None:
            return _json_error(503, "NotReady", "no performance database configured")
        try:
            stored = await in_threads(coverage_source)
        except GpuplanError as exc:  # DatabaseError after the store's own retries
            return _json_error(503, "DatabaseUnavailable", str(exc))
        except TimeoutError:
            return _json_error(504, "Timeout", "coverage query timed out")
        bundle = context.manifest.get("devices") or []
        return web.json_response(coverage_json(
            stored, [str(d) for d in bundle], context.catalog.keys(),
            bundle_rows=bundle_training_rows(context.manifest),
            bundle_version=selection.bundle_version_of(context.predictor_source)))

    async def activate(request: web.Request) -> web.Response:
        if bundle_activator is None:
            return _json_error(503, "NotReady", "no performance database configured")
        version = int(request.match_info["version"])  # the route admits digits only
        body = await request.read()
        if len(body) > MAX_OUTCOME_BODY_BYTES:
            return _json_error(413, "RequestTooLarge",
                               f"an activate request is at most {MAX_OUTCOME_BODY_BYTES} bytes")
        try:
            reason = wire.parse_activate_request(work.decode_json(body) if body.strip()
                                                 else None)
        except InvalidRequestError as exc:
            if exc.field == "body":
                return _json_error(400, "InvalidJSON", str(exc))
            return _reply(work.invalid_request_reply(exc))
        if version > wire.MAX_BUNDLE_VERSION:
            return _json_error(404, "NotFound", f"no model bundle version {version}")
        activator = bundle_activator
        try:
            active = await in_threads(lambda: activator(version, reason))
        except LookupError as exc:
            return _json_error(404, "NotFound", str(exc))
        except DatabaseError as exc:
            return _json_error(503, "DatabaseUnavailable", str(exc))
        except TimeoutError:
            return _json_error(504, "Timeout", "activating the bundle timed out")
        try:  # serve it now rather than at the next poll
            await in_threads(state.load)
        except Exception:  # activated all the same; the next poll retries the reload
            log.exception("reloading the newly activated bundle %d failed", active)
        log.info("bundle version %d activated (%s)", active, reason or "no reason given")
        return web.json_response({"active_version": active,
                                  "serving_version": state.bundle_version})

    async def models(_: web.Request) -> web.Response:
        context = state.context
        if context is None:
            return _json_error(503, "NotReady", "model bundle not loaded yet")
        fitted = state.calibration
        return web.json_response({
            **context.describe(),
            "bundle_version": selection.bundle_version_of(context.predictor_source),
            "calibration": {"outcomes": fitted.overall.outcomes,
                            "stale": state.calibration_stale,
                            "factors": dict(calibrating.summary(fitted))},
            "scaling": {**state.scaling.as_dict(), "stale": state.scaling_stale},
        })

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if state.context is None:
            return _json_error(503, "NotReady", "model bundle not loaded yet")
        return web.json_response({"status": "ready", "predictor": state.context.predictor_source})

    async def openapi_document(_: web.Request) -> web.Response:
        return web.json_response(document)

    async def metrics_endpoint(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def prune_workloads() -> None:
        if workload_pruner is None:
            return
        pruner = workload_pruner
        try:
            pruned = await asyncio.get_running_loop().run_in_executor(io_threads, pruner)
        except Exception:  # the next interval retries; plans are stored all the same
            log.exception("pruning old plan workloads failed")
            return
        if pruned:
            log.info("pruned %d plan workload(s) past their retention", pruned)

    async def lifecycle(app: web.Application) -> Any:
        async def poll() -> None:
            pruned_at = -math.inf
            while True:
                await asyncio.sleep(settings.bundle_poll_s)
                if time.monotonic() - pruned_at >= settings.workload_prune_interval_s:
                    pruned_at = time.monotonic()
                    await prune_workloads()
                try:
                    await asyncio.get_running_loop().run_in_executor(io_threads, state.load)
                except Exception:  # a broken new bundle must not take the service down
                    log.exception("reloading the model bundle failed; keeping the current one")
                if state.calibration_stale:
                    await refit_calibration()
                if state.scaling_stale:
                    request_scaling_refit()

        if state.context is None:
            await asyncio.get_running_loop().run_in_executor(io_threads, state.load)
        pool = workers.WorkerPool(state.loader, workers.PoolSettings(
            settings.workers, settings.tasks_per_worker, settings.worker_memory_bytes))
        try:
            await pool.warm_up(WARM_UP_TIMEOUT_S)
        except Exception:  # answered per request (503) and retried by the pool from now on
            log.exception("the estimation workers did not start")
        gate = admission.Admission(admission.AdmissionSettings(
            settings.workers, settings.running_per_client or settings.workers,
            settings.queued_per_client, settings.queued_total))
        front_box.append(front.Front(
            pool, gate, caching.ReplyCache(settings.cache_entries, settings.cache_bytes),
            metrics, settings.request_timeout_s))
        await refit_calibration()
        await refit_scaling()
        task = asyncio.create_task(poll())
        yield
        task.cancel()
        for pending in scaling_task:
            pending.cancel()
        front_box[0].close()
        io_threads.shutdown(wait=False, cancel_futures=True)
        await guard.close()

    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[envelope])
    app.router.add_post("/v1/plans", plans)
    app.router.add_post("/v1/estimate", estimate)
    # The writes: only callers the guard verifies (reads stay open).
    app.router.add_post("/v1/outcomes", guard.protect(outcomes))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/coverage", coverage)
    app.router.add_post(r"/v1/models/{version:\d{1,30}}/activate", guard.protect(activate))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.router.add_get(openapi.DOCUMENT_PATH, openapi_document)
    app.cleanup_ctx.append(lifecycle)
    return app
