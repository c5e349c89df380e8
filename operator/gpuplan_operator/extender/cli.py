"""Command line of the extender: `gpuplan-extender`, or `python -m gpuplan_operator.extender`."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import signal
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from prometheus_client import REGISTRY, CollectorRegistry

from gpuplan_estimator import devices
from gpuplan_estimator.core import provenance
from gpuplan_operator.extender import app as app_module
from gpuplan_operator.extender import watcher
from gpuplan_operator.extender.core import plans, store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServeSettings:
    """Everything `serve` needs; built from the command line by `settings_from_args`."""

    host: str = "127.0.0.1"
    port: int = 8888
    kubeconfig: str | None = None
    """Path of a kubeconfig; None means the in-cluster service account."""
    app: app_module.AppSettings = field(default_factory=app_module.AppSettings)
    watch: watcher.WatchSettings = field(default_factory=watcher.WatchSettings)
    metrics_host: str = "0.0.0.0"
    metrics_port: int | None = None
    """A second listener serving only GET /metrics, /healthz and /readyz, so Prometheus and the
    kubelet reach them while filter/prioritize stay on `host` (loopback in the chart); None
    serves them on the main listener only."""
    freeze_gc: bool = False
    """After the first sync, `gc.freeze()` everything alive (see `_freeze_gc_after_sync`). The
    command line turns it on; a process embedding `serve` (a test) keeps its collector as is."""


PROG = "gpuplan-extender"
DESCRIPTION = (
    "The gpuplan-scheduler HTTP extender: kube-scheduler calls POST /extender/filter and "
    "/extender/prioritize for pods of planned TrainingJobs, and it answers from an inventory of "
    "nodes and pods kept by watches (GET /readyz is ready once that inventory is fresh; "
    "/healthz, /metrics).")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the extender's flags to `parser`."""
    parser.add_argument("--kubeconfig", metavar="PATH",
                        help="kubeconfig path (default: the in-cluster service account)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="listen address; 0.0.0.0 for every interface (default %(default)s)")
    parser.add_argument("--port", type=int, default=8888,
                        help="listen TCP port (default %(default)s)")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="also serve GET /metrics, /healthz and /readyz (and nothing else) "
                        "on this TCP port, for Prometheus and kubelet probes (default: none, "
                        "only on --port)")
    parser.add_argument("--metrics-host", default="0.0.0.0",
                        help="listen address of --metrics-port (default %(default)s)")
    parser.add_argument("--stale-after-seconds", type=float, default=120.0, metavar="SECONDS",
                        help="relist and report not-ready when the inventory is older than this "
                        "(default %(default)g)")
    parser.add_argument("--resync-seconds", type=float, default=600.0, metavar="SECONDS",
                        help="relist nodes and pods this often even when watches are healthy "
                        "(default %(default)g)")
    parser.add_argument("--watch-timeout-seconds", type=int, default=60, metavar="SECONDS",
                        help="server-side timeout of each watch call (default %(default)s)")
    parser.add_argument("--max-body-bytes", type=int, default=8 * 1024 * 1024, metavar="BYTES",
                        help="largest request body, in bytes; a larger one is answered 413 "
                        "(default %(default)s = 8 MiB)")
    parser.add_argument("--no-gc-freeze", action="store_true",
                        help="do not gc.freeze() the startup objects after the first sync "
                        "(default: freeze them, which keeps collector pauses off the p99)")
    parser.add_argument("--log-level", default="INFO", metavar="LEVEL",
                        help="Python logging level: DEBUG, INFO, WARNING or ERROR "
                        "(default %(default)s)")


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add an `extender` subcommand to an argparse subparsers object; `func` holds its handler.

    A hook for embedding CLIs: no shipped command has this subcommand. The extender runs as the
    `gpuplan-extender` console script or `python -m gpuplan_operator.extender`.
    """
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "extender", help="run the gpuplan-scheduler HTTP extender")
    add_arguments(parser)
    parser.set_defaults(func=main_from_args)
    return parser


def settings_from_args(args: argparse.Namespace) -> ServeSettings:
    """ServeSettings from parsed flags; a bad flag exits with a message naming it."""
    if not 0 < args.port < 65536:
        raise SystemExit(f"--port: {args.port} is not a TCP port")
    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        raise SystemExit(f"--metrics-port: {args.metrics_port} is not a TCP port")
    if args.metrics_port == args.port:
        raise SystemExit("--metrics-port: must differ from --port")
    for name in ("stale_after_seconds", "resync_seconds", "watch_timeout_seconds",
                 "max_body_bytes"):
        if getattr(args, name) <= 0:
            raise SystemExit(f"--{name.replace('_', '-')}: must be positive")
    return ServeSettings(
        host=args.host,
        port=args.port,
        kubeconfig=args.kubeconfig,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        app=app_module.AppSettings(max_body_bytes=args.max_body_bytes,
                                   stale_after_s=args.stale_after_seconds),
        watch=watcher.WatchSettings(watch_timeout_s=args.watch_timeout_seconds,
                                    stale_after_s=args.stale_after_seconds,
                                    resync_every_s=args.resync_seconds),
        freeze_gc=not args.no_gc_freeze,
    )


async def serve(
    settings: ServeSettings,
    api: Any,
    registry: CollectorRegistry = REGISTRY,
    stop: asyncio.Event | None = None,
) -> None:
    """Run watcher and HTTP server until `stop` is set (or SIGTERM/SIGINT)."""
    inventory = store.InventoryStore(clock=time.monotonic)
    watch = watcher.kube_watcher(api, inventory, settings.watch, time.monotonic)
    watch.start()
    resolve = plans.catalog_resolver(devices.load_catalog())
    application = app_module.make_app(inventory, registry, settings=settings.app,
                                      resolve_type=resolve)
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    probe_runner = None
    if settings.metrics_port is not None:
        probe_runner = web.AppRunner(probe_app(application), access_log=None)
        await probe_runner.setup()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # not main thread
            loop.add_signal_handler(sig, stop.set)
    freezer = (asyncio.create_task(_freeze_gc_after_sync(inventory))
               if settings.freeze_gc else None)
    try:
        await web.TCPSite(runner, settings.host, settings.port).start()
        log.info("gpuplan extender listening on %s:%d", settings.host, settings.port)
        if probe_runner is not None:
            await web.TCPSite(probe_runner, settings.metrics_host, settings.metrics_port).start()
            log.info("metrics and probes on %s:%d", settings.metrics_host, settings.metrics_port)
        await stop.wait()
    finally:
        if freezer is not None:
            freezer.cancel()
        await runner.cleanup()
        if probe_runner is not None:
            await probe_runner.cleanup()
        watch.stop()


PROBE_PATHS = ("/metrics", "/healthz", "/readyz")


def probe_app(application: web.Application) -> web.Application:
    """An app with only the GET routes of `application` in PROBE_PATHS (same handlers).

    Served on --metrics-port: a NetworkPolicy can then open metrics and probes to Prometheus and
    the kubelet without opening filter/prioritize, which only kube-scheduler should call."""
    probes = web.Application()
    for route in application.router.routes():
        path = route.resource.canonical if route.resource is not None else ""
        if route.method == "GET" and path in PROBE_PATHS:
            probes.router.add_get(path, route.handler)
    return probes


async def _freeze_gc_after_sync(inventory: store.InventoryStore, poll_s: float = 0.5) -> None:
    """Once the first inventory is in, hide every object then alive from the cyclic collector.

    The process then holds ~10^5 long-lived objects (the kubernetes client, the catalog, the
    inventory); without this, every full collection walks them all, ~60–90 ms on the event loop,
    and at thousands of candidates per request one comes every few dozen requests: that pause,
    not the request work, was the p99. Frozen objects are still freed by reference counting."""
    while inventory.snapshot() is None:
        await asyncio.sleep(poll_s)
    gc.collect()
    gc.freeze()
    log.info("inventory synced; %d objects frozen out of the garbage collector",
             gc.get_freeze_count())


def main_from_args(args: argparse.Namespace) -> int:
    """Serve with parsed flags against the configured cluster; returns the exit code."""
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = settings_from_args(args)
    asyncio.run(serve(settings, watcher.core_v1_api(settings.kubeconfig)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of `gpuplan-extender` and `python -m gpuplan_operator.extender`."""
    return main_from_args(build_parser().parse_args(argv))


def build_parser() -> argparse.ArgumentParser:
    """The `gpuplan-extender` command line (also `python -m gpuplan_operator.extender`)."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {provenance.installed_version()}",
                        help="print the version and exit")
    add_arguments(parser)
    return parser


