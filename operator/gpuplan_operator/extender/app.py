"""aiohttp application of the extender: filter, prioritize, health, readiness and metrics.

Handlers only parse, take one snapshot, call the pure `scoring` functions and encode; no API
call happens on the request path.

What a request can do wrong, and the answer (every non-200 body is the JSON error envelope
`{"error": {"reason", "message", "details"}}`, see `protocol.encode_error`):

* the body is not JSON (or not UTF-8, nested too deep, `NaN`) → 400 `InvalidJSON`;
* it is JSON but not ExtenderArgs (no `Pod` object, candidates of the wrong shape) → 422
  `InvalidRequest`, each bad field a detail;
* larger than `max_body_bytes` → 413; an unknown path → 404; a wrong method → 405;
* the Pod is an object but what it holds is unreadable (annotations a list, containers a string,
  a GPU quantity "²" or 10^400, …) → **200**, the filter rejects every candidate with a reason
  naming the field, and prioritize scores it as unmanaged. An extender configured `ignorable`
  that answered an error would let such a pod schedule unfiltered.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from gpuplan_operator.extender.core import plans, protocol, scoring
from gpuplan_operator.extender.core.snapshot import Snapshot

log = logging.getLogger(__name__)

FILTER, PRIORITIZE = "filter", "prioritize"
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class SnapshotSource(Protocol):
    """Where handlers get the inventory; `InventoryStore` is the production implementation."""

    def snapshot(self) -> Snapshot | None:
        """The inventory to decide on; None before the first full sync."""

    def age_s(self) -> float | None:
        """Seconds since the inventory was last known current; None before the first sync."""


@dataclass(frozen=True)
class AppSettings:
    """HTTP-side settings of the extender."""

    max_body_bytes: int = 8 * 1024 * 1024
    """Requests above this get HTTP 413; a 5,000-node NodeNames list is ~100 KiB."""
    stale_after_s: float = 120.0
    """`/readyz` fails when the inventory was last known current longer ago than this."""


class _HttpError(Exception):
    def __init__(self, status: int, reason: str, message: str, details: Sequence[str] = ()
                 ) -> None:
        self.status = status
        self.reason = reason
        self.details = tuple(details)
        super().__init__(message)

    def response(self) -> web.Response:
        return _json(protocol.encode_error(self.reason, str(self), self.details), self.status)


@dataclass(frozen=True)
class _Metrics:
    requests: Counter
    latency: Histogram


def _make_metrics(registry: CollectorRegistry, source: SnapshotSource) -> _Metrics:
    requests = Counter(
        "gpuplan_extender_requests", "Extender requests by verb and result",
        ["verb", "result"], registry=registry,
    )
    latency = Histogram(
        "gpuplan_extender_request_duration_seconds", "Extender request handling time",
        ["verb", "result"], buckets=LATENCY_BUCKETS_S, registry=registry,
    )
    age = Gauge(
        "gpuplan_extender_inventory_age_seconds",
        "Seconds since the node/pod inventory was last known current (NaN before the first sync)",
        registry=registry,
    )
    age.set_function(lambda: _or_nan(source.age_s()))
    nodes = Gauge("gpuplan_extender_inventory_nodes", "Nodes in the inventory", registry=registry)
    nodes.set_function(lambda: _node_count(source.snapshot()))
    return _Metrics(requests=requests, latency=latency)


def _or_nan(value: float | None) -> float:
    return float("nan") if value is None else value


def _node_count(snapshot: Snapshot | None) -> float:
    return float("nan") if snapshot is None else float(len(snapshot.nodes))


def _json(data: Any, status: int = 200) -> web.Response:
    body = data if isinstance(data, bytes) else json.dumps(data, separators=(",", ":")).encode()
    return web.Response(body=body, status=status, content_type="application/json")


def _internal_error(exc: Exception) -> web.Response:
    """500 in the JSON envelope, naming only the exception's type (no traceback, no values)."""
    return _json(protocol.encode_error("InternalError", f"internal error: {type(exc).__name__}"),
                 500)


# Python's int() refuses strings past 4,300 digits; JSON numbers that long become floats (and then
# fail a type check with a reason) instead of failing the whole body.
_MAX_INT_DIGITS = 4000


def _parse_int(text: str) -> int | float:
    return int(text) if len(text) <= _MAX_INT_DIGITS else float(text)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # Go never sends NaN or Infinity


def decode_body(body: bytes) -> Any:
    """A request body as JSON: strict UTF-8, no NaN/Infinity; `_HttpError` 400 otherwise."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _HttpError(400, "InvalidJSON", f"request body is not JSON: not UTF-8 ({exc})"
                         ) from exc
    try:
        return json.loads(text, parse_int=_parse_int, parse_constant=_reject_constant)
    except RecursionError as exc:
        raise _HttpError(400, "InvalidJSON",
                         "request body is not JSON this server reads: nested too deeply") from exc
    except ValueError as exc:
        raise _HttpError(400, "InvalidJSON", f"request body is not JSON: {exc}") from exc


async def _read_args(request: web.Request, max_body_bytes: int) -> protocol.ExtenderArgs:
    try:
        body = await request.read()  # aiohttp enforces client_max_size, chunked bodies too
    except web.HTTPRequestEntityTooLarge as exc:
        raise _HttpError(413, "RequestTooLarge",
                         f"request body larger than {max_body_bytes} bytes") from exc
    except (web.RequestPayloadError, HttpProcessingError) as exc:  # e.g. bad gzip
        raise _HttpError(400, "InvalidBody",
                         f"request body unreadable: {str(exc).splitlines()[-1].strip()}") from exc
    try:
        return protocol.parse_args(decode_body(body))
    except protocol.ProtocolError as exc:
        raise _HttpError(422, "InvalidRequest", str(exc), exc.details) from exc


Decision = tuple[str, bytes]  # (result label, JSON response body)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_REASONS = {404: "NotFound", 405: "MethodNotAllowed", 413: "RequestTooLarge"}


class Decisions:
    """The verbs' decisions over one snapshot source: parse the pod's plan, then score."""

    def __init__(self, snapshot_source: SnapshotSource, resolve_type: plans.TypeResolver
                 ) -> None:
        self.snapshot_source = snapshot_source
        self.resolve_type = resolve_type

    def read_plan(self, args: protocol.ExtenderArgs) -> plans.PodPlan | None:
        """The pod's plan; PlanError for anything unreadable, an unexpected failure included."""
        try:
            return plans.plan_for_pod(args.pod, self.resolve_type)
        except plans.PlanError:
            raise
        except Exception as exc:  # a bug in reading must reject the pod, not let it through
            log.exception("reading the plan of %s failed", args.pod_key)
            raise plans.PlanError("Pod", f"unreadable ({type(exc).__name__})") from exc

    async def filter(self, args: protocol.ExtenderArgs) -> Decision:
        """`filter`: the nodes the pod's plan fits on; 503 before the first sync."""
        try:
            plan = self.read_plan(args)
        except plans.PlanError as exc:
            result = scoring.reject_all(args.node_names, f"invalid gpuplan plan: {exc}")
            return "invalid_plan", protocol.dumps_filter_result(result, args)
        if plan is None:
            return "pass_through", protocol.dumps_filter_result(
                scoring.pass_through(args.node_names), args)
        snapshot = self.snapshot_source.snapshot()
        if snapshot is None:
            raise _HttpError(503, "NotReady", "gpuplan inventory has not synced yet")
        result = scoring.filter_nodes(snapshot, plan, args.node_names)
        log.debug("filter %s: %d passed, %d failed", args.pod_key, len(result.passed),
                  len(result.failed) + len(result.failed_unresolvable))
        return "ok", protocol.dumps_filter_result(result, args)

    async def prioritize(self, args: protocol.ExtenderArgs) -> Decision:
        """`prioritize`: a score per node; never an error (the filter rejects bad plans)."""
        try:
            plan = self.read_plan(args)
        except plans.PlanError:
            plan = None  # the filter already rejected it; scores must never error
        scores = scoring.prioritize_scores(self.snapshot_source.snapshot(), plan,
                                           args.node_names)
        return ("ok" if plan else "pass_through"), protocol.dumps_scores(
            args.node_names, scores, args.plain_names)


def verb_handler(
    verb: str, decide: Callable[[protocol.ExtenderArgs], Awaitable[Decision]],
    metrics: _Metrics, max_body_bytes: int,
) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The handler of one extender verb: read the args, decide, count and time the result."""

    async def handle(request: web.Request) -> web.Response:
        started = time.perf_counter()
        try:
            args = await _read_args(request, max_body_bytes)
            result, body = await decide(args)
            response = _json(body)
        except _HttpError as exc:
            result, response = f"http_{exc.status}", exc.response()
        except Exception as exc:  # a bug must cost one request, not the process
            log.exception("%s failed", verb)
            result, response = "internal_error", _internal_error(exc)
        metrics.requests.labels(verb, result).inc()
        metrics.latency.labels(verb, result).observe(time.perf_counter() - started)
        return response

    return handle


class Probes:
    """Health, readiness (a synced, fresh inventory) and Prometheus metrics."""

    def __init__(self, snapshot_source: SnapshotSource, registry: CollectorRegistry,
                 stale_after_s: float) -> None:
        self.snapshot_source = snapshot_source
        self.registry = registry
        self.stale_after_s = stale_after_s

    async def healthz(self, _: web.Request) -> web.Response:
        """`GET /healthz`."""
        return web.Response(text="ok")

    async def readyz(self, _: web.Request) -> web.Response:
        """`GET /readyz`: 503 before the first sync or once the inventory is stale."""
        age = self.snapshot_source.age_s()
        if age is None:
            return web.Response(status=503, text="inventory not synced")
        if age > self.stale_after_s:
            return web.Response(status=503, text=f"inventory stale: {age:.0f}s old")
        return web.Response(text="ok")

    async def metrics(self, _: web.Request) -> web.Response:
        """`GET /metrics`: Prometheus text."""
        response = web.Response(body=generate_latest(self.registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response


@web.middleware
async def errors_as_json(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own errors (404, 405, 413 …) in the JSON envelope, not as plain text."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        reason = _REASONS.get(exc.status, exc.reason.replace(" ", ""))
        response = _json(protocol.encode_error(
            reason, f"{exc.status} {exc.reason}: {request.method} {request.path[:200]}"),
            exc.status)
        if "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response
    except Exception as exc:  # outside the verbs (health, metrics): still JSON, no traceback
        log.exception("%s %s failed", request.method, request.path[:200])
        return _internal_error(exc)


def make_app(
    snapshot_source: SnapshotSource,
    registry: CollectorRegistry,
    *,
    settings: AppSettings | None = None,
    resolve_type: plans.TypeResolver = plans.resolve_gfd_only,
) -> web.Application:
    """The extender's HTTP app; serve it with aiohttp's runner or the test client."""
    cfg = settings or AppSettings()
    metrics = _make_metrics(registry, snapshot_source)
    decisions = Decisions(snapshot_source, resolve_type)
    probes = Probes(snapshot_source, registry, cfg.stale_after_s)
    app = web.Application(client_max_size=cfg.max_body_bytes, middlewares=[errors_as_json])
    app.router.add_post("/extender/filter", verb_handler(
        FILTER, decisions.filter, metrics, cfg.max_body_bytes))
    app.router.add_post("/extender/prioritize", verb_handler(
        PRIORITIZE, decisions.prioritize, metrics, cfg.max_body_bytes))
    app.router.add_get("/healthz", probes.healthz)
    app.router.add_get("/readyz", probes.readyz)
    app.router.add_get("/metrics", probes.metrics)
    return app
