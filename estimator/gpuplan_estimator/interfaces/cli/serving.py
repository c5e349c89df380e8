"""`gpuplan serve`: the estimator HTTP service."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import os
import ssl
import threading
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors, paths
from gpuplan_estimator.core.errors import GpuplanError, InvalidRequestError
from gpuplan_estimator.devices.prices import PRICES_ENV
from gpuplan_estimator.interfaces.cli import arguments, plans
from gpuplan_estimator.interfaces.http import auth, service, storage, tls, tokenreview, wire
from gpuplan_estimator.interfaces.http.state import BundleSync
from gpuplan_estimator.planning import calibrating, planner

if TYPE_CHECKING:
    import pandas as pd

    from gpuplan_estimator.perfdb import PerfStore

log = logging.getLogger(__name__)


def register(sub: Any) -> None:
    """Add the ``serve`` subcommand to an argparse subparsers object."""
    s = sub.add_parser("serve", help="run the estimator HTTP service",
                       description="Answer plans and estimates over HTTP (POST /v1/plans, "
                       "/v1/estimate, /v1/outcomes, /v1/models/VERSION/activate; GET "
                       "/v1/models, /v1/coverage, /healthz, /readyz, /metrics, /openapi.json) "
                       "until stopped; the operator calls it.")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on; 0.0.0.0 for every interface (default %(default)s)")
    s.add_argument("--port", type=arguments.count_up_to(65535), default=8080,
                   help="TCP port to listen on (default %(default)s)")
    s.add_argument("--metrics-port", type=arguments.count_up_to(65535), default=None,
                   metavar="PORT", help="serve GET /metrics alone on this port, and not on "
                   "--port (default: on --port, beside the API)")
    s.add_argument("--ephemeral-data", action="store_true",
                   help="the data dir does not outlive the process (the chart's emptyDir): "
                   "warn at start-up that SQLite outcomes, calibration and bundles are lost at "
                   "every restart")
    s.add_argument("--bundle", metavar="DIR",
                   help="model bundle directory (default: the performance database's active "
                   "bundle, else the newest in the data dir, else the shipped one)")
    s.add_argument("--bundle-cache", metavar="DIR", default=None,
                   help="where database bundles are unpacked, one directory per version "
                   "(default: bundle-cache in the gpuplan data dir)")
    s.add_argument("--request-timeout", type=arguments.duration_seconds, default=60.0,
                   metavar="DURATION", help="per-request deadline, queueing included (seconds, "
                   "or a duration like 2m); the worker running a request past it is killed "
                   "(default 60)")
    s.add_argument("--workers", type=arguments.count_up_to(256), default=2, metavar="N",
                   help="estimation worker processes (default 2)")
    s.add_argument("--worker-memory-gib", type=arguments.positive_float, default=3.0,
                   metavar="GIB", help="data segment one worker may grow to (RLIMIT_DATA), in "
                   "GiB, model bundle included; a model needing more is answered 422 (default 3)")
    s.add_argument("--running-per-client", type=arguments.count_up_to(256), default=None,
                   metavar="N", help="hard cap on the estimates one client (peer address + "
                   "X-Gpuplan-Client header) runs at once (default: none; a client already "
                   "running never takes the last free worker, and freed workers go to the client "
                   "running fewest)")
    s.add_argument("--queued-per-client", type=arguments.count_up_to(10_000), default=64,
                   metavar="N",
                   help="requests a client may have waiting; more get 429 (default 64)")
    s.add_argument("--body-bytes-per-client", type=arguments.positive_int,
                   default=service.ServiceSettings.body_bytes_per_client,
                   metavar="BYTES", help="request bytes one client may have admitted at once; "
                   "a request past it is answered 429 before its body is read (default "
                   "%(default)s = 128 MiB)")
    s.add_argument("--body-bytes-total", type=arguments.positive_int,
                   default=service.ServiceSettings.body_bytes_total,
                   metavar="BYTES", help="request bytes all clients together may have admitted "
                   "at once (default %(default)s = 512 MiB)")
    s.add_argument("--max-body-bytes", type=arguments.positive_int, default=64 * 2**20,
                   metavar="BYTES", help="largest request body, in bytes; a larger one is "
                   "answered 413 (default %(default)s = 64 MiB)")
    s.add_argument("--bundle-poll", type=arguments.duration_seconds, default=30.0,
                   metavar="DURATION", help="how often to ask the database for its active "
                   "bundle and look for a newer one in the data dir (seconds, or a duration "
                   "like 1m; default 30)")
    s.add_argument("--db", metavar="URL", help="performance database URL for job outcomes "
                   "(default: $GPUPLAN_DB_URL, else SQLite in the data dir)")
    s.add_argument("--max-namespace-share", type=arguments.share,
                   default=calibrating.CalibrationSettings.max_namespace_share, metavar="FRACTION",
                   help="most of a GPU type's calibration weight one namespace's job outcomes "
                   "may hold, so one tenant moves the others' factor by a bounded amount "
                   "(docs/security.md; default 0.34)")
    s.add_argument("--workload-retention", type=arguments.duration_seconds,
                   default=WORKLOAD_RETENTION_S, metavar="DURATION",
                   help="keep a plan's stored workload this long unless a job outcome names it "
                   "(the promotion gate re-estimates those); checked hourly (a duration like "
                   "720h, or seconds; default 720h = 30 days)")
    s.add_argument("--prices", default=None, metavar="PROVIDER|FILE",
                   help=f"{arguments.PRICES_HELP} (default: ${devices.PROVIDER_ENV}, else "
                   f"${PRICES_ENV}, which the Helm chart sets from its pricesProvider and "
                   "prices values)")
    s.add_argument("--catalog", default=None, metavar="FILE",
                   help=f"{arguments.CATALOG_HELP} (default: ${devices.CATALOG_ENV}, which the "
                   "Helm chart sets when its catalog value is given)")
    add_write_auth_flags(s)
    s.set_defaults(func=run_serve)


WRITE_AUTH_ENV = "GPUPLAN_WRITE_AUTH"
WRITE_ALLOWED_SUBJECTS_ENV = "GPUPLAN_WRITE_ALLOWED_SUBJECTS"
WRITE_AUTH_AUDIENCES_ENV = "GPUPLAN_WRITE_AUTH_AUDIENCES"
WRITE_AUTH_KUBECONFIG_ENV = "GPUPLAN_WRITE_AUTH_KUBECONFIG"


def add_write_auth_flags(s: argparse.ArgumentParser) -> None:
    """Who may post outcomes and activate bundles (issue #16; `interfaces.http.auth`)."""
    s.add_argument("--write-auth", choices=auth.MODES, default=None,
                   help="how POST /v1/outcomes and /v1/models/VERSION/activate authenticate: "
                   "tokenreview (the caller's Kubernetes ServiceAccount token, verified by a "
                   "TokenReview, must belong to --write-allowed-subjects) or none (open) "
                   f"(default: ${WRITE_AUTH_ENV}, else none when --host is loopback; any other "
                   "host must choose)")
    s.add_argument("--write-allowed-subjects", default=None, metavar="USERS",
                   help="comma-separated ServiceAccount usernames allowed to write, "
                   "system:serviceaccount:NAMESPACE:NAME (default: "
                   f"${WRITE_ALLOWED_SUBJECTS_ENV}; the chart passes the operator's)")
    s.add_argument("--write-auth-audiences", default=None, metavar="AUDIENCES",
                   help="comma-separated audiences the token must be for (default: "
                   f"${WRITE_AUTH_AUDIENCES_ENV}, else the API server's own, which a pod's "
                   "mounted ServiceAccount token carries)")
    s.add_argument("--write-auth-kubeconfig", default=None, metavar="FILE",
                   help="credentials for the TokenReview (default: "
                   f"${WRITE_AUTH_KUBECONFIG_ENV}, else the pod's ServiceAccount, else "
                   "$KUBECONFIG); they need `create` on tokenreviews.authentication.k8s.io")
    s.add_argument("--write-auth-timeout", type=arguments.duration_seconds, default=5.0,
                   metavar="DURATION", help="deadline of one TokenReview; past it the write is "
                   "answered 503 (default 5)")
    s.add_argument("--write-auth-cache-ttl", type=arguments.duration_seconds, default=60.0,
                   metavar="DURATION", help="how long a verified token is trusted without "
                   "asking again (default 60; 0 asks every time)")
    s.add_argument("--tls-cert", default=None, metavar="FILE",
                   help="serve the API over HTTPS with this PEM certificate (chain); needs "
                   "--tls-key; a renewed certificate (files changed in place) is served from "
                   "the next connection on, no restart (docs/security.md#tls). /metrics on "
                   "--metrics-port stays plain HTTP")
    s.add_argument("--tls-key", default=None, metavar="FILE",
                   help="the PEM private key of --tls-cert")


def _listed(text: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (text or "").split(",") if p.strip())


def write_auth_settings(args: argparse.Namespace, environ: Mapping[str, str]
                        ) -> auth.WriteAuthSettings:
    """The write-auth settings from flags, else GPUPLAN_* variables, else the loopback default;
    InvalidRequestError naming every problem (a public listener with no mode is one)."""
    mode = args.write_auth or environ.get(WRITE_AUTH_ENV) or auth.default_mode(args.host)
    if mode is None:
        raise InvalidRequestError(
            "--write-auth", f"--host {args.host} is reachable from other machines: choose "
            "--write-auth tokenreview (with --write-allowed-subjects) or, knowingly, "
            f"--write-auth none (or set ${WRITE_AUTH_ENV})")
    subjects = args.write_allowed_subjects
    audiences = args.write_auth_audiences
    settings = auth.WriteAuthSettings(
        mode=mode,  # type: ignore[arg-type]  # checked by problems()
        allowed_subjects=_listed(subjects if subjects is not None
                                 else environ.get(WRITE_ALLOWED_SUBJECTS_ENV)),
        audiences=_listed(audiences if audiences is not None
                          else environ.get(WRITE_AUTH_AUDIENCES_ENV)),
        kubeconfig=args.write_auth_kubeconfig or environ.get(WRITE_AUTH_KUBECONFIG_ENV) or None,
        timeout_s=args.write_auth_timeout, cache_ttl_s=args.write_auth_cache_ttl)
    problems = settings.problems()
    if problems:
        raise GpuplanError("; ".join(problems))
    return settings



# Opening a store runs its migrations. Requests reach the stores from worker threads, and the
# first job outcomes often arrive together: unguarded, two threads could migrate one SQLite
# file at once (a suspect, not a proven cause, of the install test's occasional outcome 500).
_OPEN_LOCK = threading.Lock()


def _lazy_store(db_url: str | None) -> Callable[[], PerfStore]:
    """The performance database, opened on first use: the service starts (and answers plans)
    without one, and a database that is down fails only the calls that need it. Opened once,
    and never while another lazy store is opening (`_OPEN_LOCK`)."""
    from gpuplan_estimator.perfdb import PerfStore

    stores: list[PerfStore] = []

    def store() -> PerfStore:
        if not stores:
            with _OPEN_LOCK:
                if not stores:
                    stores.append(PerfStore.open(db_url))
        return stores[0]

    return store


def perfdb_outcome_sink(db_url: str | None) -> storage.OutcomeSink:
    """Job outcomes go to the performance database, opened on first use.

    The plan's estimate was already calibrated; dividing by the factor it was planned with
    stores the model's own estimate, so refitting measures the model, not the model times an
    earlier calibration (which would count every correction twice).
    """
    store = _lazy_store(db_url)

    def sink(req: wire.OutcomeRequest, device: str) -> tuple[int, bool]:
        factor = req.calibration_factor
        sc = req.scaling

        def own(planned_ms: float | None) -> float | None:
            # The plan's step parts carry the calibration like its estimated_seconds.
            return planned_ms / factor if planned_ms is not None else None

        stored = store().record_job_outcome(
            job_uid=req.job_uid, device=device, gpu_count=req.gpu_count,
            estimated_seconds=req.estimated_seconds / factor,
            actual_seconds=req.actual_seconds, model_digest=req.model_digest,
            gpus_per_node=sc.gpus_per_node, nodes=sc.nodes, per_gpu_batch=sc.per_gpu_batch,
            steps=sc.steps, forward_ms=own(sc.forward_ms), backward_ms=own(sc.backward_ms),
            optimizer_ms=own(sc.optimizer_ms), gradient_bytes=sc.gradient_bytes,
            intra_node_gbps=sc.intra_node_gbps, workload_id=req.workload_id,
            namespace=req.namespace)
        return stored.id, stored.created

    return sink


class OutcomeRows:
    """The stored job outcomes as last read, brought up to date by reading only the rows added
    since: a refit per outcome used to read the whole table (~0.1 s at 600 rows on
    PostgreSQL), holding one of the service's two I/O threads while plans waited to store their
    workloads (issue #33). Outcomes are never deleted, so a count equal to the rows kept means
    nothing is new; a count that disagrees after the new rows are added (a row committed out
    of id order, by another replica) reads the whole table again. Shared by the calibration
    and scaling refits; thread-safe (the I/O threads call it)."""

    def __init__(self, store: Callable[[], PerfStore]) -> None:
        self._store = store
        self._frame: pd.DataFrame | None = None
        self._lock = threading.Lock()
        self.full_reads = 0

    def frame(self) -> pd.DataFrame:
        """Every stored outcome, oldest first (`PerfStore.job_outcomes`); do not modify."""
        import pandas as pd  # with the database, as `_lazy_store` opens it

        with self._lock:
            store = self._store()
            count = store.job_outcome_count()
            kept = self._frame
            if kept is not None and len(kept) == count:
                return kept
            if kept is not None and len(kept) > 0:
                newer = store.job_outcomes(after_id=int(kept["id"].max()))
                merged = pd.concat([kept, newer], ignore_index=True) if len(newer) else kept
                if len(merged) == count:
                    self._frame = merged
                    return merged
            self._frame = store.job_outcomes()
            self.full_reads += 1
            return self._frame


def perfdb_outcome_rows(db_url: str | None) -> OutcomeRows:
    """The job outcomes of the database, opened on first use, read incrementally."""
    return OutcomeRows(_lazy_store(db_url))


def perfdb_outcome_history(db_url: str | None, rows: OutcomeRows | None = None
                           ) -> storage.OutcomeHistory:
    """Stored job outcomes as calibration samples, from the database opened on first use
    (`rows`, shared with the scaling history, else its own).

    Whole jobs of training: mode "train", and the job's seconds stand for its steps' time (the
    factor is a ratio, so the unit cancels).
    """
    outcomes = rows or perfdb_outcome_rows(db_url)

    def history() -> list[calibrating.Outcome]:
        frame = outcomes.frame()
        return [calibrating.Outcome(str(device), "train", predicted_ms=float(estimated) * 1000.0,
                                    measured_ms=float(actual) * 1000.0, model=str(digest),
                                    namespace=str(namespace))
                for device, estimated, actual, digest, namespace in zip(
                    frame["device"], frame["estimated_seconds"], frame["actual_seconds"],
                    frame["model_digest"], frame["namespace"], strict=True)]

    return history


def perfdb_scaling_history(db_url: str | None, rows: OutcomeRows | None = None
                           ) -> storage.ScalingHistory:
    """Stored job outcomes as records (every column, NULL as None or NaN) for the scaling fit
    (`parallel.scaling.fit_from_outcomes`), from the database opened on first use (`rows`,
    shared with the calibration history, else its own)."""
    outcomes = rows or perfdb_outcome_rows(db_url)

    def history() -> list[Mapping[str, Any]]:
        return [{str(k): v for k, v in r.items()}
                for r in outcomes.frame().to_dict("records")]

    return history


BUNDLE_SYNC_RETRIES = 1
"""The bundle poll retries a failing database once: the next poll comes soon anyway, and a
database that is down must not hold up start-up for the store's full backoff."""


def perfdb_bundle_sync(db_url: str | None, cache_dir: Path) -> BundleSync:
    """Keeps `cache_dir` on the database's active bundle (`selection.sync_active_bundle`)."""
    from gpuplan_estimator.latency import selection
    from gpuplan_estimator.perfdb import PerfStore

    stores: list[PerfStore] = []

    def sync() -> int | None:
        first = not stores  # the cache may be another database's: check its bytes once
        if first:
            stores.append(PerfStore.open(db_url, retries=BUNDLE_SYNC_RETRIES))
        cache_dir.mkdir(parents=True, exist_ok=True)
        return selection.sync_active_bundle(cache_dir, stores[0], trust_cache=not first)

    return sync


def perfdb_workload_sink(db_url: str | None) -> storage.WorkloadSink:
    """Plans' workloads go to the performance database (`PerfStore.add_workload`), opened on
    first use."""
    store = _lazy_store(db_url)

    def sink(workload_id: str, data: bytes, device: str, gpu_count: int) -> None:
        store().add_workload(workload_id, data, device=device, gpu_count=gpu_count)

    return sink


WORKLOAD_RETENTION_S = 30 * 24 * 3600.0
"""Longer than a plan waits in a queue and its job runs, so the outcome that names a workload
arrives while it is still stored."""


def perfdb_workload_pruner(db_url: str | None, retention_s: float,
                           clock: Callable[[], datetime] = lambda: datetime.now(UTC)
                           ) -> storage.WorkloadPruner:
    """Deletes plan workloads older than `retention_s` that no outcome names
    (`PerfStore.prune_workloads`), from the database opened on first use."""
    store = _lazy_store(db_url)

    def prune() -> int:
        return store().prune_workloads(older_than=clock() - timedelta(seconds=retention_s))

    return prune


def perfdb_bundle_activator(db_url: str | None) -> storage.BundleActivator:
    """`POST /v1/models/{version}/activate` activates in the database, opened on first use."""
    store = _lazy_store(db_url)

    def activate(version: int, reason: str) -> int:
        return store().activate(version, reason)

    return activate


def perfdb_coverage_source(db_url: str | None) -> storage.CoverageSource:
    """Coverage per device from the performance database, opened on first use."""
    store = _lazy_store(db_url)

    def source() -> dict[str, tuple[int, datetime | None]]:
        return store().coverage()

    return source


def with_host_probes(loader: Callable[[], planner.PlannerContext], db_url: str | None
                     ) -> Callable[[], planner.PlannerContext]:
    """`loader` whose contexts carry the database's host probes, read at each load (start,
    a new bundle, a fresh worker): a partial, so it pickles to the workers."""
    return functools.partial(context_with_host_probes, loader, db_url)


def context_with_host_probes(loader: Callable[[], planner.PlannerContext],
                             db_url: str | None) -> planner.PlannerContext:
    """`loader()`'s context with the database's host probes (module level, so a
    `functools.partial` of it pickles to the service's workers). When the database cannot be
    read the context keeps none, and says so in the log: estimates then use the bundle's
    host model, as before the first benchmark."""
    from gpuplan_estimator.perfdb import probe_context  # SQLAlchemy only when serving with it

    context = loader()
    try:
        probes = probe_context.read_probes(db_url)
    except errors.DatabaseError:
        log.exception("reading host probes from the performance database failed; estimates "
                      "use the bundle's host model")
        return context
    if probes:
        log.info("host probes for %s", ", ".join(sorted(probes)))
    return dataclasses.replace(context, host_probes=probes)


EPHEMERAL_WARNING = (
    "the performance database is SQLite on a volume that does not outlive this pod (emptyDir): "
    "job outcomes, the calibration learnt from them and activated bundles are lost at every "
    "restart; set estimator.persistence.enabled or estimator.database.urlSecret")


def warn_if_ephemeral(ephemeral: bool, db_url: str | None) -> bool:
    """Log `EPHEMERAL_WARNING` when SQLite (no database URL) lives on ephemeral storage;
    returns whether it did."""
    if ephemeral and not db_url:
        logging.getLogger(__name__).warning(EPHEMERAL_WARNING)
        return True
    return False


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
        body_bytes_per_client=args.body_bytes_per_client, body_bytes_total=args.body_bytes_total,
        metrics_port=args.metrics_port, max_namespace_share=args.max_namespace_share,
    )
    warn_if_ephemeral(args.ephemeral_data, args.db or os.environ.get(paths.DB_URL_ENV))
    problems = service.intake_settings(settings).problems()
    if problems:
        raise GpuplanError("; ".join(problems))
    # A partial, not a lambda: every estimation worker process builds its context with it.
    prices: devices.PriceChoice = (args.prices or os.environ.get(devices.PROVIDER_ENV)
                                   or devices.prices_from_env(os.environ) or None)
    catalog_file = args.catalog or devices.catalog_file_from_env(os.environ)
    # A bad catalog file or price choice stops the start, naming the file and field.
    devices.apply_prices(devices.load_catalog(user_file=catalog_file), prices)
    file_context = functools.partial(plans.load_context, args.bundle, prices, catalog_file)
    if args.bundle is not None:  # an explicit bundle is pinned: the database's is not served
        state = service.ServiceState(with_host_probes(file_context, args.db))
    else:
        cache = Path(args.bundle_cache) if args.bundle_cache else paths.data_dir() / "bundle-cache"
        state = service.ServiceState(with_host_probes(
            functools.partial(service.database_bundle_context, str(cache), file_context, prices,
                              catalog_file),
            args.db), bundle_sync=perfdb_bundle_sync(args.db, cache))
    write_auth = write_auth_settings(args, os.environ)
    try:
        guard = auth.build_guard(write_auth)
    except tokenreview.CredentialsError as exc:
        raise GpuplanError(f"--write-auth tokenreview: {exc}") from exc
    if write_auth.mode == "none" and not auth.is_loopback(args.host):
        log.warning(
            "--write-auth none on %s: any client that reaches it can post outcomes and "
            "activate bundles", args.host)
    if args.bundle is not None:
        state.load()  # fail fast on a broken explicit bundle (a laptop's serve)
    # Otherwise the bundle loads behind the open port, so /readyz can say 503 meanwhile.
    outcome_rows = perfdb_outcome_rows(args.db)
    app = service.make_app(state, settings, outcome_sink=perfdb_outcome_sink(args.db),
                           coverage_source=perfdb_coverage_source(args.db),
                           outcome_history=perfdb_outcome_history(args.db, outcome_rows),
                           scaling_history=perfdb_scaling_history(args.db, outcome_rows),
                           bundle_activator=perfdb_bundle_activator(args.db),
                           workload_sink=perfdb_workload_sink(args.db),
                           workload_pruner=perfdb_workload_pruner(args.db,
                                                                  args.workload_retention),
                           write_guard=guard)
    web.run_app(app, host=settings.host, port=settings.port,
                ssl_context=server_tls(args.tls_cert, args.tls_key))
    return 0


def server_tls(cert_file: str | None, key_file: str | None) -> ssl.SSLContext | None:
    """The API port's TLS context from `--tls-cert`/`--tls-key` (TLS 1.2 or later); None when
    neither is given. One without the other, or files that do not load, stop the start naming
    the flag. A renewed pair is served from the next handshake on (`http.tls`)."""
    if cert_file is None and key_file is None:
        return None
    if cert_file is None or key_file is None:
        raise GpuplanError("--tls-cert and --tls-key go together: give both or neither")
    try:
        return tls.ReloadingCertificate(cert_file, key_file).context
    except (OSError, ssl.SSLError) as exc:
        raise GpuplanError(f"--tls-cert/--tls-key: cannot load {cert_file} with {key_file}: "
                           f"{exc}") from exc
