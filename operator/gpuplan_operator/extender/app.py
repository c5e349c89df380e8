"""aiohttp application of the extender: filter, prioritize, health, readiness and metrics.

Handlers only parse, take one snapshot, call the pure `scoring` functions and encode; no API
call happens on the request path. Every bad request is answered with JSON carrying `Error` and a
4xx status, never with a traceback.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from gpuplan_operator.extender import plans, protocol, scoring
from gpuplan_operator.extender.inventory import Snapshot

log = logging.getLogger(__name__)

FILTER, PRIORITIZE = "filter", "prioritize"
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class SnapshotSource(Protocol):
    """Where handlers get the inventory; `InventoryStore` is the production implementation."""

    def snapshot(self) -> Snapshot | None:
        """The inventory to decide on; None before the first full sync."""

    def age_seconds(self) -> float | None:
        """Seconds since the inventory was last known current; None before the first sync."""


@dataclass(frozen=True)
class AppSettings:
    """HTTP-side settings of the extender."""

    max_body_bytes: int = 8 * 1024 * 1024
    """Requests above this get HTTP 413; a 5,000-node NodeNames list is ~100 KiB."""
    stale_after_s: float = 120.0
    """`/readyz` fails when the inventory was last known current longer ago than this."""


class _HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        self.status = status
        super().__init__(message)


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
    age.set_function(lambda: _or_nan(source.age_seconds()))
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


async def _read_args(request: web.Request, max_body_bytes: int) -> protocol.ExtenderArgs:
    try:
        body = await request.read()  # aiohttp enforces client_max_size, chunked bodies too
    except web.HTTPRequestEntityTooLarge as exc:
        raise _HttpError(413, f"request body larger than {max_body_bytes} bytes") from exc
    try:
        decoded = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise _HttpError(400, f"request body is not JSON: {exc}") from exc
    try:
        return protocol.parse_args(decoded)
    except protocol.ProtocolError as exc:
        raise _HttpError(400, str(exc)) from exc


Decision = tuple[str, bytes]  # (result label, JSON response body)


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

    async def decide_filter(args: protocol.ExtenderArgs) -> Decision:
        try:
            plan = plans.plan_for_pod(args.pod, resolve_type)
        except plans.PlanError as exc:
            result = scoring.reject_all(args.node_names, f"invalid gpuplan plan: {exc}")
            return "invalid_plan", protocol.dumps_filter_result(result, args)
        if plan is None:
            return "pass_through", protocol.dumps_filter_result(
                scoring.pass_through(args.node_names), args)
        snapshot = snapshot_source.snapshot()
        if snapshot is None:
            raise _HttpError(503, "gpuplan inventory has not synced yet")
        result = scoring.filter_nodes(snapshot, plan, args.node_names)
        log.debug("filter %s: %d passed, %d failed", args.pod_key, len(result.passed),
                  len(result.failed) + len(result.failed_unresolvable))
        return "ok", protocol.dumps_filter_result(result, args)

    async def decide_prioritize(args: protocol.ExtenderArgs) -> Decision:
        try:
            plan = plans.plan_for_pod(args.pod, resolve_type)
        except plans.PlanError:
            plan = None  # the filter already rejected it; scores must never error
        scores = scoring.prioritize(snapshot_source.snapshot(), plan, args.node_names)
        return ("ok" if plan else "pass_through"), protocol.dumps_priorities(scores)

    def verb_handler(
        verb: str, decide: Callable[[protocol.ExtenderArgs], Awaitable[Decision]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                args = await _read_args(request, cfg.max_body_bytes)
                result, body = await decide(args)
                response = _json(body)
            except _HttpError as exc:
                result, response = f"http_{exc.status}", _json(
                    protocol.encode_filter_error(str(exc)), exc.status)
            except Exception as exc:  # a bug must cost one request, not the process
                log.exception("%s failed", verb)
                result, response = "internal_error", _json(
                    protocol.encode_filter_error(f"internal error: {exc!r}"), 500)
            metrics.requests.labels(verb, result).inc()
            metrics.latency.labels(verb, result).observe(time.perf_counter() - started)
            return response

        return handle

    async def healthz(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(_: web.Request) -> web.Response:
        age = snapshot_source.age_seconds()
        if age is None:
            return web.Response(status=503, text="inventory not synced")
        if age > cfg.stale_after_s:
            return web.Response(status=503, text=f"inventory stale: {age:.0f}s old")
        return web.Response(text="ok")

    async def metrics_handler(_: web.Request) -> web.Response:
        response = web.Response(body=generate_latest(registry))
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    app = web.Application(client_max_size=cfg.max_body_bytes)
    app.router.add_post("/extender/filter", verb_handler(FILTER, decide_filter))
    app.router.add_post("/extender/prioritize", verb_handler(PRIORITIZE, decide_prioritize))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler)
    return app
