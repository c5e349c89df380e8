"""`gpuplan serve` (the estimator HTTP service) and `gpuplan plan` (the planner, offline)."""

from __future__ import annotations

import argparse
import base64
import functools
import json
import logging
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import limits, options
from gpuplan_estimator.interfaces.cli import arguments
from gpuplan_estimator.interfaces.http import service, wire
from gpuplan_estimator.models import selection
from gpuplan_estimator.planning import calibrating, planner

if TYPE_CHECKING:
    from gpuplan_estimator.perfdb import PerfStore


def load_context(bundle_dir: str | None) -> planner.PlannerContext:
    """Planner context: the device catalog and the predictor from `bundle_dir` or default."""
    predictor, source = selection.select_predictor(bundle_dir)
    manifest = getattr(getattr(predictor, "bundle", None), "manifest", {}) or {}
    return planner.PlannerContext(
        catalog=devices.load_catalog(), predictor=predictor, predictor_source=source,
        manifest=manifest if isinstance(manifest, dict) else {},
    )


def register(sub: Any) -> None:
    """Add the ``serve`` and ``plan`` subcommands to an argparse subparsers object."""
    s = sub.add_parser("serve", help="run the estimator HTTP service")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=arguments.count_up_to(65535), default=8080)
    s.add_argument("--bundle", help="model bundle directory (default: newest, else shipped)")
    s.add_argument("--request-timeout", type=arguments.positive_float, default=60.0,
                   metavar="SECONDS", help="per-request deadline, queueing included; the "
                   "worker running a request past it is killed (default 60)")
    s.add_argument("--workers", type=arguments.count_up_to(256), default=2,
                   help="estimation worker processes (default 2)")
    s.add_argument("--worker-memory-gib", type=arguments.positive_float, default=3.0,
                   help="data segment one worker may grow to (RLIMIT_DATA), model bundle "
                   "included; a model needing more is answered 422 (default 3)")
    s.add_argument("--running-per-client", type=arguments.count_up_to(256), default=None,
                   help="hard cap on the estimates one client (peer address + X-Gpuplan-Client "
                   "header) runs at once (default: none; a client already running never takes "
                   "the last free worker, and freed workers go to the client running fewest)")
    s.add_argument("--queued-per-client", type=arguments.count_up_to(10_000), default=64,
                   help="requests a client may have waiting; more get 429 (default 64)")
    s.add_argument("--max-body-bytes", type=arguments.positive_int, default=64 * 2**20)
    s.add_argument("--bundle-poll", type=arguments.positive_float, default=30.0, metavar="SECONDS",
                   help="how often to look for a newer bundle")
    s.add_argument("--db", help="performance database URL for job outcomes "
                   "(default: $GPUPLAN_DB_URL, else SQLite in the data dir)")
    s.set_defaults(func=run_serve)

    p = sub.add_parser("plan", help="choose GPU type and count for a model and an objective")
    p.add_argument("model", help="ONNX file (may be gzip/xz/zstd-compressed)")
    p.add_argument("--batch", type=arguments.count_up_to(limits.MAX_BATCH_SIZE), required=True,
                   help="global batch size")
    p.add_argument("--dataset-size", type=arguments.count_up_to(limits.MAX_DATASET_SIZE),
                   required=True)
    p.add_argument("--epochs", type=arguments.count_up_to(limits.MAX_EPOCHS), default=1)
    p.add_argument("--dim", type=arguments.dim_binding, action="append", default=[])
    p.add_argument("--optimizer", default=options.DEFAULT_OPTIMIZER, choices=options.OPTIMIZERS)
    p.add_argument("--precision", default=options.DEFAULT_PRECISION, choices=options.PRECISIONS)
    p.add_argument("--prefer", default=options.DEFAULT_OBJECTIVE, choices=options.OBJECTIVES)
    p.add_argument("--max-gpus", type=arguments.count_up_to(options.MAX_GPUS_CAP),
                   default=options.DEFAULT_MAX_GPUS)
    p.add_argument("--deadline", type=arguments.positive_float, metavar="SECONDS")
    p.add_argument("--budget", type=arguments.positive_float, metavar="USD")
    p.add_argument("--pool", action="append", default=[], metavar="TYPE=NODESxGPUS",
                   help="GPU pool, e.g. NVIDIA-H100-80GB-HBM3=2x8 (default: 1x8 of every GPU)")
    p.add_argument("--bundle")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run_plan)


def _lazy_store(db_url: str | None) -> Callable[[], PerfStore]:
    """The performance database, opened on first use: the service starts (and answers plans)
    without one, and a database that is down fails only the calls that need it."""
    from gpuplan_estimator.perfdb import PerfStore

    stores: list[PerfStore] = []

    def store() -> PerfStore:
        if not stores:
            stores.append(PerfStore.open(db_url))
        return stores[0]

    return store


def perfdb_outcome_sink(db_url: str | None) -> service.OutcomeSink:
    """Job outcomes go to the performance database, opened on first use.

    The plan's estimate was already calibrated; dividing by the factor it was planned with
    stores the model's own estimate, so refitting measures the model, not the model times an
    earlier calibration (which would count every correction twice).
    """
    store = _lazy_store(db_url)

    def sink(req: wire.OutcomeRequest, device: str) -> tuple[int, bool]:
        stored = store().record_job_outcome(
            job_uid=req.job_uid, device=device, gpu_count=req.gpu_count,
            estimated_seconds=req.estimated_seconds / req.calibration_factor,
            actual_seconds=req.actual_seconds, model_digest=req.model_digest)
        return stored.id, stored.created

    return sink


def perfdb_outcome_history(db_url: str | None) -> service.OutcomeHistory:
    """Stored job outcomes as calibration samples, from the database opened on first use.

    Whole jobs of training: mode "train", and the job's seconds stand for its steps' time (the
    factor is a ratio, so the unit cancels).
    """
    store = _lazy_store(db_url)

    def history() -> list[calibrating.Outcome]:
        frame = store().job_outcomes()
        return [calibrating.Outcome(str(device), "train", predicted_ms=float(estimated) * 1000.0,
                                    measured_ms=float(actual) * 1000.0, model=str(digest))
                for device, estimated, actual, digest in zip(
                    frame["device"], frame["estimated_seconds"], frame["actual_seconds"],
                    frame["model_digest"], strict=True)]

    return history


def perfdb_coverage_source(db_url: str | None) -> service.CoverageSource:
    """Coverage per device from the performance database, opened on first use."""
    store = _lazy_store(db_url)

    def source() -> dict[str, tuple[int, datetime | None]]:
        return store().coverage()

    return source


def run_serve(args: argparse.Namespace) -> int:
    """`gpuplan serve`: run the estimator HTTP service until stopped; returns 0."""
    from aiohttp import web

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    settings = service.ServiceSettings(
        host=args.host, port=args.port, max_body_bytes=args.max_body_bytes,
        request_timeout_s=args.request_timeout, bundle_poll_s=args.bundle_poll,
        workers=args.workers, running_per_client=args.running_per_client,
        worker_memory_bytes=int(args.worker_memory_gib * 2**30),
        queued_per_client=args.queued_per_client,
    )
    # A partial, not a lambda: every estimation worker process builds its context with it.
    state = service.ServiceState(functools.partial(load_context, args.bundle))
    state.load()  # fail fast on a broken explicit bundle
    app = service.make_app(state, settings, outcome_sink=perfdb_outcome_sink(args.db),
                           coverage_source=perfdb_coverage_source(args.db),
                           outcome_history=perfdb_outcome_history(args.db))
    web.run_app(app, host=settings.host, port=settings.port)
    return 0


def _pools(specs: list[str]) -> list[dict[str, Any]]:
    if not specs:
        return [{"gpu_type": d.key, "gpus_per_node": 8, "nodes": 1, "free_gpus": 8}
                for d in devices.load_catalog().devices]
    pools = []
    for text in specs:
        name, _, shape = text.rpartition("=")
        nodes, _, gpus = shape.partition("x")
        if not name or not nodes.isdigit() or not gpus.isdigit():
            raise wire.InvalidRequestError("--pool", f"expected TYPE=NODESxGPUS, got {text!r}")
        pools.append({"gpu_type": name, "gpus_per_node": int(gpus), "nodes": int(nodes),
                      "free_gpus": int(nodes) * int(gpus)})
    return pools


def run_plan(args: argparse.Namespace) -> int:
    """`gpuplan plan`: choose GPU type and count for a model offline; print table or JSON."""
    body = {
        "model_onnx_b64": base64.b64encode(Path(args.model).read_bytes()).decode(),
        "training": {"batch_size": args.batch, "dataset_size": args.dataset_size,
                     "epochs": args.epochs, "optimizer": args.optimizer,
                     "precision": args.precision, "dims": dict(args.dim)},
        "objective": {"prefer": args.prefer, "max_gpus": args.max_gpus,
                      "deadline_seconds": args.deadline, "budget_usd": args.budget},
        "inventory": _pools(args.pool),
    }
    result = planner.plan_request(wire.parse_plan_request(body), load_context(args.bundle))
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    chosen = result["plan"]
    print(f"plan: {chosen['gpu_count']} x {chosen['gpu_type']} ({chosen['nodes']} node(s)), "
          f"{chosen['estimated_seconds'] / 3600:.2f} h, ${chosen['cost_usd']:.2f}")
    print(f"{'GPU TYPE':<26}{'GPUS':>5}{'STEP ms':>11}{'HOURS':>9}{'COST $':>10}")
    for c in result["candidates"][:10]:
        print(f"{c['gpu_type']:<26}{c['gpu_count']:>5}{c['step_time_ms']:>11.1f}"
              f"{c['estimated_seconds'] / 3600:>9.2f}{c['cost_usd']:>10.2f}")
    return 0
