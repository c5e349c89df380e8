"""The estimator service's route handlers and the middleware that wraps every answer.

A handler reads the request, asks the shared state, the front (estimates and plans) or a
storage port (outcomes, coverage, activation), and answers JSON; every failure is the one
error envelope (`work.error_reply`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpuplan_estimator.core.errors import (
    DatabaseError,
    GpuplanError,
    InvalidRequestError,
    UnknownDeviceError,
)
from gpuplan_estimator.interfaces.http import admission, auth, front, intake, wire, work
from gpuplan_estimator.interfaces.http.coverage import bundle_training_rows, coverage_json
from gpuplan_estimator.interfaces.http.metrics import Metrics
from gpuplan_estimator.interfaces.http.refits import Refits
from gpuplan_estimator.interfaces.http.state import ServiceState
from gpuplan_estimator.interfaces.http.storage import IoThreads, Storage, WorkloadKeeper
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import calibrating, planner

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_OUTCOME_BODY_BYTES = 64 * 1024
"""A job outcome is a dozen fields; anything larger is not one."""

_HTTP_REASONS = {404: "NotFound", 405: "MethodNotAllowed", 413: "RequestTooLarge"}


def _reply(reply: work.Reply) -> web.Response:
    return web.json_response(reply.body, status=reply.status)


def _json_error(status: int, reason: str, message: str) -> web.Response:
    return _reply(work.error_reply(status, reason, message))


def split_workload(document: dict[str, Any]) -> Mapping[str, Any]:
    """Take the worker's workload (`work.WORKLOAD_KEY`) out of a plan document; {} when it
    has none."""
    found = document.pop(work.WORKLOAD_KEY, None)
    return found if isinstance(found, Mapping) else {}


def envelope_middleware(metrics: Metrics, max_body_bytes: int) -> Middleware:
    """Every answer is counted, and every failure is the JSON error envelope."""

    @web.middleware
    async def envelope(request: web.Request, handler: Handler) -> web.StreamResponse:
        start = time.perf_counter()
        resource = request.match_info.route.resource
        endpoint = resource.canonical if resource is not None else "unknown"
        try:
            response = await handler(request)
        except web.HTTPException as exc:
            reason = _HTTP_REASONS.get(exc.status, exc.reason.replace(" ", ""))
            message = (f"body exceeds {max_body_bytes} bytes" if exc.status == 413
                       else f"{exc.reason}: {request.method} {request.path[:200]}")
            response = _json_error(exc.status, reason, message)
        except Exception:  # a bug of ours: logged, and still an envelope
            log.exception("unhandled error on %s %s", request.method, request.path[:200])
            response = _json_error(500, "Internal", "internal error; see the service log")
        metrics.requests.labels(endpoint, str(response.status)).inc()
        metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
        return response

    return envelope


class Routes:
    """The handlers, over their injected parts; `front` is set once the workers are up."""

    def __init__(self, state: ServiceState, storage: Storage, io: IoThreads, refits: Refits,
                 workloads: WorkloadKeeper, metrics: Metrics, request_timeout_s: float,
                 openapi_document: Mapping[str, Any], bodies: intake.Intake,
                 guard: auth.WriteGuard) -> None:
        self.state = state
        self.storage = storage
        self.io = io
        self.refits = refits
        self.workloads = workloads
        self.metrics = metrics
        self.request_timeout_s = request_timeout_s
        self.document = openapi_document
        self.intake = bodies
        self.guard = guard
        self.front: front.Front | None = None
        self.startup_error: str | None = None
        """Why the bundle or the workers could not start (then /healthz fails)."""
        self.started = asyncio.Event()
        """Set once start-up ended, well or not (`service.Lifecycle.start`)."""

    def after_start(self, handler: Handler) -> Handler:
        """`handler`, run once start-up ended: the port opens before the bundle is loaded
        (issue #33), and a request that arrives meanwhile waits for it within its deadline
        rather than being refused (the readiness probe keeps the Service's traffic away)."""
        async def waiting(request: web.Request) -> web.StreamResponse:
            if not self.started.is_set():
                try:
                    await asyncio.wait_for(self.started.wait(), self.request_timeout_s)
                except TimeoutError:
                    return _json_error(503, "NotReady", "still loading the model bundle")
            return await handler(request)
        return waiting

    async def _estimation(self, endpoint: str, request: web.Request) -> web.Response:
        context = self.state.context
        if context is None or self.front is None:
            return _json_error(503, "NotReady", "model bundle not loaded yet")
        client = await self.guard.fairness_key(request.headers.get("Authorization"),
                                               request.headers.get(admission.CLIENT_HEADER),
                                               request.remote)
        try:  # admitted before its body is read (issue #33): a refused body is never read
            with self.intake.hold(client, request.content_length):
                return await self._answer(endpoint, request, context, client)
        except intake.TooLarge as exc:
            return _json_error(413, "RequestTooLarge", str(exc))
        except admission.Busy as exc:
            return _json_error(429, "TooManyRequests", str(exc))

    async def _answer(self, endpoint: str, request: web.Request,
                      context: planner.PlannerContext, client: str) -> web.Response:
        assert self.front is not None
        deadline = asyncio.get_running_loop().time() + self.request_timeout_s
        ask = front.Ask(
            endpoint=endpoint, body=await request.read(), bundle=context.predictor_source,
            calibration=self.state.calibration,
            calibration_generation=self.state.calibration_generation,
            scaling_fit=self.state.scaling, client=client, deadline=deadline)
        found = await self.front.answer(ask)
        body = found.body
        if found.status == 200:  # the version of the bundle the workers answered with
            answer = json.loads(body)
            answer["bundle_version"] = selection.bundle_version_of(ask.bundle)
            if endpoint.startswith("plans"):
                answer["workload_id"] = await self.workloads.store(split_workload(answer))
            body = json.dumps(answer).encode("utf-8")
        return web.Response(body=body, status=found.status, content_type="application/json")

    async def plans(self, request: web.Request) -> web.Response:
        """`POST /v1/plans`."""
        return await self._estimation("plans_with_workload" if self.storage.workload_sink
                                      is not None else "plans", request)

    async def estimate(self, request: web.Request) -> web.Response:
        """`POST /v1/estimate`."""
        return await self._estimation("estimate", request)

    async def outcomes(self, request: web.Request) -> web.Response:
        """`POST /v1/outcomes`: store a finished job's outcome, then refit the calibration."""
        context = self.state.context
        sink = self.storage.outcome_sink
        if sink is None or context is None:
            return _json_error(503, "NotReady", "no performance database configured")
        body = await request.read()
        if len(body) > MAX_OUTCOME_BODY_BYTES:
            return _json_error(413, "RequestTooLarge",
                               f"a job outcome is at most {MAX_OUTCOME_BODY_BYTES} bytes")
        try:
            data = work.decode_json(body)
        except InvalidRequestError as exc:
            return _json_error(400, "InvalidJSON", str(exc))
        try:
            req = wire.parse_outcome_request(data)
            try:
                device = context.catalog.resolve(req.gpu_type).key
            except UnknownDeviceError as exc:
                raise InvalidRequestError("gpu_type", str(exc)) from exc
            row, created = await self.io.run(lambda: sink(req, device))
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
        await self.refits.refit_calibration()
        self.refits.request_scaling_refit()
        return web.json_response({"id": row, "device": device, "duplicate": False},
                                 status=201)

    async def coverage(self, _: web.Request) -> web.Response:
        """`GET /v1/coverage`."""
        context = self.state.context
        source = self.storage.coverage_source
        if source is None or context is None:
            return _json_error(503, "NotReady", "no performance database configured")
        try:
            stored = await self.io.run(source)
        except GpuplanError as exc:  # DatabaseError after the store's own retries
            return _json_error(503, "DatabaseUnavailable", str(exc))
        except TimeoutError:
            return _json_error(504, "Timeout", "coverage query timed out")
        bundle = context.manifest.get("devices") or []
        return web.json_response(coverage_json(
            stored, [str(d) for d in bundle], context.catalog.keys(),
            bundle_rows=bundle_training_rows(context.manifest),
            bundle_version=selection.bundle_version_of(context.predictor_source)))

    async def activate(self, request: web.Request) -> web.Response:
        """`POST /v1/models/{version}/activate`: activate a stored bundle and serve it now."""
        activator = self.storage.bundle_activator
        if activator is None:
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
        try:
            active = await self.io.run(lambda: activator(version, reason))
        except LookupError as exc:
            return _json_error(404, "NotFound", str(exc))
        except DatabaseError as exc:
            return _json_error(503, "DatabaseUnavailable", str(exc))
        except TimeoutError:
            return _json_error(504, "Timeout", "activating the bundle timed out")
        try:  # serve it now rather than at the next poll
            await self.io.run(self.state.load)
        except Exception:  # activated all the same; the next poll retries the reload
            log.exception("reloading the newly activated bundle %d failed", active)
        log.info("bundle version %d activated (%s)", active, reason or "no reason given")
        return web.json_response({"active_version": active,
                                  "serving_version": self.state.bundle_version})

    async def models(self, _: web.Request) -> web.Response:
        """`GET /v1/models`: the bundle in use, its calibration and scaling model."""
        context = self.state.context
        if context is None:
            return _json_error(503, "NotReady", "model bundle not loaded yet")
        fitted = self.state.calibration
        return web.json_response({
            **context.describe(),
            "bundle_version": selection.bundle_version_of(context.predictor_source),
            "calibration": {"outcomes": fitted.overall.outcomes,
                            "stale": self.state.calibration_stale,
                            "factors": dict(calibrating.summary(fitted))},
            "scaling": {**self.state.scaling.as_dict(), "stale": self.state.scaling_stale},
        })

    async def healthz(self, _: web.Request) -> web.Response:
        """`GET /healthz`: alive unless start-up failed (the kubelet then restarts it)."""
        if self.startup_error is not None:
            return _json_error(503, "StartupFailed", self.startup_error)
        return web.json_response({"status": "ok"})

    async def readyz(self, _: web.Request) -> web.Response:
        """`GET /readyz`: ready once a bundle is loaded and the workers started."""
        context = self.state.context
        if context is None or self.front is None:
            return _json_error(503, "NotReady", "loading the model bundle and starting the "
                               "estimation workers")
        return web.json_response({"status": "ready", "predictor": context.predictor_source})

    async def openapi_document(self, _: web.Request) -> web.Response:
        """The OpenAPI document."""
        return web.json_response(self.document)

    async def metrics_endpoint(self, _: web.Request) -> web.Response:
        """`GET /metrics`: Prometheus text."""
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
