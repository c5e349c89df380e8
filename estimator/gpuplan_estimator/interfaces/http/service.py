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
points the cache at it (`latency.selection.sync_active_bundle`); the context loader, here and in
every worker, serves what the cache points at (`database_bundle_context`). Every estimate, plan
and coverage answer names the database version (`bundle_version`, null for a file bundle).

The parts are injected, each in its own module: the shared state (`state`), the storage ports
and I/O threads (`storage`), the refits (`refits`) and the route handlers (`routes`); this module
holds the settings, the start-up and polling lifecycle, and `make_app`, which wires them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuplan_estimator import devices
from gpuplan_estimator.interfaces.http import (
    admission,
    auth,
    caching,
    front,
    intake,
    openapi,
    work,
    workers,
)
from gpuplan_estimator.interfaces.http.metrics import Metrics
from gpuplan_estimator.interfaces.http.refits import Refits, ScalingFitSettings
from gpuplan_estimator.interfaces.http.routes import Routes, envelope_middleware
from gpuplan_estimator.interfaces.http.state import ServiceState
from gpuplan_estimator.interfaces.http.storage import (
    BundleActivator,
    CoverageSource,
    IoThreads,
    OutcomeHistory,
    OutcomeSink,
    ScalingHistory,
    Storage,
    WorkloadKeeper,
    WorkloadPruner,
    WorkloadSink,
)
from gpuplan_estimator.latency import selection
from gpuplan_estimator.parallel import scaling
from gpuplan_estimator.planning import calibrating, planner

log = logging.getLogger(__name__)

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
    body_bytes_per_client: int = 128 * 2**20
    """Request bytes one client may have admitted at once (read, queued or running); a body
    past it gets 429 before it is read (`intake`, issue #33)."""
    body_bytes_total: int = 512 * 2**20
    """The same for every client together."""
    cache_entries: int = 512
    cache_bytes: int = 256 * 2**20
    scaling_min_samples: int = scaling.MIN_FIT_SAMPLES
    """Multi-GPU outcomes with scaling fields needed before the scaling model is fitted."""
    scaling_random_state: int = 0
    """Seed of the scaling fit (differential evolution and its held-out folds)."""
    metrics_port: int | None = None
    """Serve /metrics on this port alone (and not on `port`); None: on `port`, beside the API."""
    workload_prune_interval_s: float = 3600.0
    """How often the bundle poll also prunes old plan workloads (`WorkloadPruner`)."""
    max_namespace_share: float = calibrating.CalibrationSettings.max_namespace_share
    """Most of a GPU type's calibration weight one namespace may hold (issue #33)."""


def intake_settings(settings: ServiceSettings) -> intake.IntakeSettings:
    """The body caps of `settings` (`intake`)."""
    return intake.IntakeSettings(settings.max_body_bytes, settings.body_bytes_per_client,
                                 settings.body_bytes_total)


def memory_plan(settings: ServiceSettings) -> intake.MemoryPlan:
    """What sizes the service's memory under `settings` (`intake.client_worst_case_bytes`)."""
    return intake.MemoryPlan(
        workers=settings.workers,
        running_per_client=settings.running_per_client or settings.workers,
        worker_memory_bytes=settings.worker_memory_bytes,
        bytes_per_client=settings.body_bytes_per_client,
        bytes_total=settings.body_bytes_total, cache_bytes=settings.cache_bytes)


def database_bundle_context(
    cache_dir: str, fallback: work.ContextLoader, prices: devices.PriceChoice = None,
    catalog_file: str | None = None,
) -> planner.PlannerContext:
    """The context of the database bundle the cache points at, else `fallback()` (the data-dir
    or shipped bundle). Module-level, so a `functools.partial` of it pickles to the workers."""
    found = selection.select_cached_predictor(Path(cache_dir))
    if found is None:
        return fallback()
    predictor, source = found
    manifest = getattr(getattr(predictor, "bundle", None), "manifest", {}) or {}
    return planner.PlannerContext(
        catalog=devices.apply_prices(devices.load_catalog(user_file=catalog_file), prices),
        predictor=predictor,
        predictor_source=source, manifest=dict(manifest))


class Lifecycle:
    """Start-up (bundle, workers, first refits), the bundle poll, and shutdown."""

    def __init__(self, state: ServiceState, settings: ServiceSettings, metrics: Metrics,
                 io: IoThreads, refits: Refits, routes: Routes, guard: auth.WriteGuard,
                 workload_pruner: WorkloadPruner | None) -> None:
        self.state = state
        self.settings = settings
        self.metrics = metrics
        self.io = io
        self.refits = refits
        self.routes = routes
        self.guard = guard
        self.workload_pruner = workload_pruner

    async def prune_workloads(self) -> None:
        """Delete plan workloads past their retention; a failure waits for the next interval."""
        if self.workload_pruner is None:
            return
        try:
            pruned = await self.io.run_unbounded(self.workload_pruner)
        except Exception:  # the next interval retries; plans are stored all the same
            log.exception("pruning old plan workloads failed")
            return
        if pruned:
            log.info("pruned %d plan workload(s) past their retention", pruned)

    async def poll(self) -> None:
        """Every `bundle_poll_s`: prune when due, reload the bundle, retry stale refits."""
        pruned_at = -math.inf
        while True:
            await asyncio.sleep(self.settings.bundle_poll_s)
            if time.monotonic() - pruned_at >= self.settings.workload_prune_interval_s:
                pruned_at = time.monotonic()
                await self.prune_workloads()
            try:
                await self.io.run_unbounded(self.state.load)
            except Exception:  # a broken new bundle must not take the service down
                log.exception("reloading the model bundle failed; keeping the current one")
            if self.state.calibration_stale:
                await self.refits.refit_calibration()
            if self.state.scaling_stale:
                self.refits.request_scaling_refit()

    async def start_front(self) -> front.Front:
        """Load the bundle if needed, start the workers and put the queue and cache before
        them."""
        settings = self.settings
        if self.state.context is None:
            await self.io.run_unbounded(self.state.load)
        pool = workers.WorkerPool(self.state.loader, workers.PoolSettings(
            settings.workers, settings.tasks_per_worker, settings.worker_memory_bytes))
        try:
            await pool.warm_up(WARM_UP_TIMEOUT_S)
        except Exception:  # answered per request (503) and retried by the pool from now on
            log.exception("the estimation workers did not start")
        gate = admission.Admission(admission.AdmissionSettings(
            settings.workers, settings.running_per_client or settings.workers,
            settings.queued_per_client, settings.queued_total))
        return front.Front(
            pool, gate, caching.ReplyCache(settings.cache_entries, settings.cache_bytes),
            self.metrics, settings.request_timeout_s)

    async def start(self) -> None:
        """Load the bundle, start the workers, fit, then poll; behind an open port, so /readyz
        answers 503 meanwhile (issue #33) and a failed start makes /healthz fail."""
        try:
            front_ = await self.start_front()
        except Exception as exc:  # the kubelet's probes restart the pod
            log.exception("the estimator could not start")
            self.routes.startup_error = f"{type(exc).__name__}: {exc}"
            self.routes.started.set()
            return
        self.routes.front = front_
        try:
            await self.refits.refit_calibration()
            await self.refits.refit_scaling()
        finally:
            self.routes.started.set()
        await self.poll()

    async def __call__(self, app: web.Application) -> AsyncIterator[None]:
        """aiohttp's cleanup context: start in the background, then shut down."""
        metrics_site = await self.open_metrics_port()
        task = asyncio.create_task(self.start())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        self.refits.cancel()
        if self.routes.front is not None:
            self.routes.front.close()
        self.io.shutdown()
        await self.guard.close()
        if metrics_site is not None:
            await metrics_site.cleanup()

    async def open_metrics_port(self) -> web.AppRunner | None:
        """Serve GET /metrics alone on `metrics_port`, when one is set."""
        if self.settings.metrics_port is None:
            return None
        runner = web.AppRunner(make_metrics_app(self.routes))
        await runner.setup()
        await web.TCPSite(runner, self.settings.host, self.settings.metrics_port).start()
        return runner


def make_metrics_app(routes: Routes) -> web.Application:
    """The metrics listener: `GET /metrics` only; any other method or path is refused, so a
    scraper cannot reach the API (issue #33)."""
    app = web.Application(client_max_size=1024)
    app.router.add_get("/metrics", routes.metrics_endpoint)
    return app


def _watch_fits(metrics: Metrics, state: ServiceState) -> None:
    """The fits' health on /metrics, read at scrape time."""
    metrics.calibration_stale.set_function(lambda: float(state.calibration_stale))
    metrics.calibration_outcomes.set_function(lambda: state.calibration.overall.outcomes)
    metrics.scaling_samples.set_function(lambda: state.scaling.samples)
    metrics.scaling_fitted.set_function(lambda: float(state.scaling.source == "fitted"))
    metrics.scaling_stale.set_function(lambda: float(state.scaling_stale))


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
    storage = Storage(outcome_sink, coverage_source, outcome_history, scaling_history,
                      bundle_activator, workload_sink, workload_pruner)
    metrics = Metrics(registry or CollectorRegistry())
    _watch_fits(metrics, state)
    io = IoThreads(settings.request_timeout_s)
    refits = Refits(state, metrics, io, outcome_history, scaling_history, ScalingFitSettings(
        settings.scaling_min_samples, settings.scaling_random_state),
        calibrating.CalibrationSettings(max_namespace_share=settings.max_namespace_share))
    routes = Routes(state, storage, io, refits, WorkloadKeeper(workload_sink, io), metrics,
                    settings.request_timeout_s, openapi.document(),
                    intake.Intake(intake_settings(settings)), guard)
    app = web.Application(client_max_size=settings.max_body_bytes,
                          middlewares=[envelope_middleware(metrics, settings.max_body_bytes)])
    started = routes.after_start
    app.router.add_post("/v1/plans", started(routes.plans))
    app.router.add_post("/v1/estimate", started(routes.estimate))
    # The writes: only callers the guard verifies (reads stay open).
    app.router.add_post("/v1/outcomes", guard.protect(started(routes.outcomes)))
    app.router.add_get("/v1/models", started(routes.models))
    app.router.add_get("/v1/coverage", started(routes.coverage))
    app.router.add_post(r"/v1/models/{version:\d{1,30}}/activate",
                        guard.protect(started(routes.activate)))
    app.router.add_get("/healthz", routes.healthz)
    app.router.add_get("/readyz", routes.readyz)
    if settings.metrics_port is None:
        app.router.add_get("/metrics", routes.metrics_endpoint)
    app.router.add_get(openapi.DOCUMENT_PATH, routes.openapi_document)
    app.cleanup_ctx.append(Lifecycle(state, settings, metrics, io, refits, routes, guard,
                                     workload_pruner))
    return app
