"""The estimator HTTP service (`gpuplan serve`): aiohttp, because kopf already depends on it.

Handlers are thin: decode JSON under a body cap, hand the pure work to `engine` in a worker
thread under a per-request timeout, encode the result. The model bundle is loaded once and
swapped atomically (a single attribute assignment) when a newer one appears. The calibration
from job outcomes is refitted at start-up and after every stored outcome, and swapped the same
way; it lives beside the bundle, not in it, so a new bundle keeps it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)

from gpuplan_estimator.core.errors import GpuplanError, InvalidModelError, InvalidRequestError
from gpuplan_estimator.interfaces.http import wire
from gpuplan_estimator.planning import calibrating, planner

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class ServiceSettings:
    """Listen address, limits and polling interval of the estimator HTTP service."""
    host: str = "0.0.0.0"
    port: int = 8080
    max_body_bytes: int = 64 * 2**20
    """Request body cap; a larger body gets 413."""
    request_timeout_s: float = 60.0
    """Per-request budget for estimation work; past it the client gets 504."""
    bundle_poll_s: float = 30.0
    """How often to look for a newer model bundle."""
    workers: int = 2


class Metrics:
    """Prometheus request counter and latency histogram of the service, in `registry`."""
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            # The operator exports gpuplan_estimator_requests_total (its calls, by outcome).
            "gpuplan_estimator_http_requests_total", "Estimator HTTP requests served",
            ["endpoint", "code"], registry=registry,
        )
        self.latency = Histogram(
            "gpuplan_estimator_request_seconds", "Estimator request latency",
            ["endpoint"], registry=registry,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        )


class ServiceState:
    """What handlers share: the current planner context and the outcome calibration.

    The context is swapped whole on a new bundle, the calibration fitted from job outcomes
    swapped whole on a new outcome.
    """

    def __init__(self, context_loader: Callable[[], planner.PlannerContext]) -> None:
        self._loader = context_loader
        self.context: planner.PlannerContext | None = None
        self.calibration = calibrating.Calibration()

    def load(self) -> bool:
        """(Re)load; returns True when a different bundle is now in use."""
        new = self._loader()
        old = self.context
        if old is not None and old.predictor_source == new.predictor_source:
            return False
        self.context = new  # atomic swap: requests in flight keep the old object
        log.info("using predictor %s", new.predictor_source)
        return True


def _json_error(status: int, reason: str, message: str, details: list[str] | None = None
                ) -> web.Response:
    return web.json_response(wire.error_json(reason, message, details), status=status)


def _invalid_request(exc: InvalidRequestError) -> web.Response:
    """422 naming the bad fields, one detail each."""
    return _json_error(422, "InvalidRequest", str(exc), list(exc.details))


OutcomeSink = Callable[[wire.OutcomeRequest, str], int]
"""Stores a finished job's outcome (with the canonical device key); returns the row id."""


OutcomeHistory = Callable[[], Sequence[calibrating.Outcome]]
"""Every stored job outcome, against the model's uncalibrated estimate — `PerfStore`."""


CoverageSource = Callable[[], Mapping[str, tuple[int, datetime | None]]]
"""Per device key: (measurement rows, end of the newest finished benchmark run) — `PerfStore`."""


def coverage_json(
    stored: Mapping[str, tuple[int, datetime | None]], bundle_devices: Iterable[str],
    catalog_keys: Iterable[str],
) -> dict[str, Any]:
    """`GET /v1/coverage`: every catalog, bundle or database device, so absence means 0 rows."""
    in_bundle = set(bundle_devices)
    out: dict[str, Any] = {}
    for key in sorted({*catalog_keys, *in_bundle, *stored}):
        rows, newest = stored.get(key, (0, None))
        out[key] = {"measurements": rows,
                    "newest_run_unix": newest.timestamp() if newest is not None else None,
                    "in_bundle": key in in_bundle}
    return {"devices": out}


def make_app(
    state: ServiceState,
    settings: ServiceSettings = ServiceSettings(),
    registry: CollectorRegistry | None = None,
    outcome_sink: OutcomeSink | None = None,
    coverage_source: CoverageSource | None = None,
    outcome_history: OutcomeHistory | None = None,
) -> web.Application:
    """The service; without `outcome_history` (no database) predictions stay uncalibrated."""
    metrics = Metrics(registry or CollectorRegistry())
    executor = ThreadPoolExecutor(max_workers=settings.workers, thread_name_prefix="estimate")
    # One refit at a time, so a slow earlier read never replaces a newer calibrating.
    refitting = asyncio.Lock()

    @web.middleware
    async def observe(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        resource = request.match_info.route.resource
        endpoint = resource.canonical if resource is not None else "unknown"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            metrics.requests.labels(endpoint, str(exc.status)).inc()
            if exc.status == 413:
                return _json_error(413, "RequestTooLarge",
                                   f"body exceeds {settings.max_body_bytes} bytes")
            raise
        metrics.requests.labels(endpoint, str(response.status)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        return response

    async def run_pure(fn: Callable[[], Any]) -> Any:
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(executor, fn),
                                      timeout=settings.request_timeout_s)

    async def read_json(request: web.Request) -> Any:
        try:
            return await request.json()
        except json.JSONDecodeError as exc:
            raise InvalidRequestError("body", f"invalid JSON: {exc.msg} at {exc.pos}") from exc

    async def refit_calibration() -> None:
        """Refit from every stored outcome; on any failure keep the calibration in use."""
        if outcome_history is None:
            return
        history = outcome_history
        async with refitting:
            try:
                fitted = await run_pure(lambda: calibrating.fit(history()))
            except Exception:  # the outcome is stored either way; the next refit catches up
                log.exception("refitting the calibration from job outcomes failed; keeping the "
                              "current one")
                return
            state.calibration = fitted  # atomic swap, like the bundle
        log.info("calibration from %d job outcomes: %s", fitted.overall.outcomes,
                 calibrating.summary(fitted))

    async def guarded(work: Callable[[planner.PlannerContext], Any]) -> web.Response:
        current = state.context
        if current is None:
            return _json_error(503, "NotReady", "model bundle not loaded yet")
        context = dataclasses.replace(current, calibration=state.calibration)
        try:
            result = await run_pure(lambda: work(context))
        except InvalidModelError as exc:
            return _json_error(422, "InvalidModel", str(exc))
        except InvalidRequestError as exc:
            return _invalid_request(exc)
        except planner.NoFeasiblePlanError as exc:
            return _json_error(422, "NoFeasiblePlan", str(exc), list(exc.details))
        except GpuplanError as exc:
            return _json_error(422, "InvalidRequest", str(exc))
        except TimeoutError:
            return _json_error(504, "Timeout",
                               f"estimation exceeded {settings.request_timeout_s} s")
        return web.json_response(result)

    async def plans(request: web.Request) -> web.Response:
        try:
            req = wire.parse_plan_request(await read_json(request))
        except InvalidRequestError as exc:
            return _invalid_request(exc)
        return await guarded(lambda ctx: planner.plan_request(req, ctx))

    async def estimate(request: web.Request) -> web.Response:
        try:
            req = wire.parse_estimate_request(await read_json(request))
        except InvalidRequestError as exc:
            return _invalid_request(exc)
        return await guarded(lambda ctx: planner.estimate_request(req, ctx))

    async def outcomes(request: web.Request) -> web.Response:
        context = state.context
        if outcome_sink is None or context is None:
            return _json_error(503, "NotReady", "no performance database configured")
        try:
            req = wire.parse_outcome_request(await read_json(request))
            device = context.catalog.resolve(req.gpu_type).key
            row = await run_pure(lambda: outcome_sink(req, device))
        except InvalidRequestError as exc:
            return _invalid_request(exc)
        except GpuplanError as exc:
            return _json_error(422, "InvalidRequest", str(exc))
        # Before answering, so the plan the operator asks for next already learned from it.
        await refit_calibration()
        return web.json_response({"id": row, "device": device}, status=201)

    async def coverage(_: web.Request) -> web.Response:
        context = state.context
        if coverage_source is None or context is None:
            return _json_error(503, "NotReady", "no performance database configured")
        try:
            stored = await run_pure(coverage_source)
        except GpuplanError as exc:  # DatabaseError after the store's own retries
            return _json_error(503, "DatabaseUnavailable", str(exc))
        except TimeoutError:
            return _json_error(504, "Timeout", "coverage query timed out")
        bundle = context.manifest.get("devices") or []
        return web.json_response(coverage_json(stored, [str(d) for d in bundle],
                                               context.catalog.keys()))

    async def models(_: web.Request) -> web.Response:
        context = state.context
        if context is None:
            return _json_error(503, "NotReady", "model bundle not loaded yet")
        fitted = state.calibration
        return web.json_response({
            **context.describe(),
            "calibration": {"outcomes": fitted.overall.outcomes,
                            "factors": dict(calibrating.summary(fitted))},
        })

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_: web.Request) -> web.Response:
        if state.context is None:
            return _json_error(503, "NotReady", "model bundle not loaded yet")
        return web.json_response({"status": "ready", "predictor": state.context.predictor_source})

    async def metrics_endpoint(_: web.Request) -> web.Response:
        body = generate_latest(metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def poll_bundles(app: web.Application) -> Any:
        async def loop() -> None:
            while True:
                await asyncio.sleep(settings.bundle_poll_s)
                try:
                    await asyncio.get_running_loop().run_in_executor(executor, state.load)
                except Exception:  # a broken new bundle must not take the service down
                    log.exception("reloading the model bundle failed; keeping the current one")

        if state.context is None:
            await asyncio.get_running_loop().run_in_executor(executor, state.load)
        await refit_calibration()
        task = asyncio.create_task(loop())
        yield
        task.cancel()
        executor.shutdown(wait=False, cancel_futures=True)

    app = web.Application(client_max_size=settings.max_body_bytes, middlewares=[observe])
    app.router.add_post("/v1/plans", plans)
    app.router.add_post("/v1/estimate", estimate)
    app.router.add_post("/v1/outcomes", outcomes)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/coverage", coverage)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_endpoint)
    app.cleanup_ctx.append(poll_bundles)
    return app
