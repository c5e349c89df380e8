"""Issue #33's three-tenant campaign on the testbed: the real control plane, the real operator
and estimator processes (`make abuse-full`).

    PYTHONPATH=tests:testbed:hack .venv/bin/python -m campaigns.tenants_testbed \
        [--hostile-jobs 1000] [--honest-jobs 10] [--postgres]

A benchmark, not a test: it prints a table and asserts nothing. On a private testbed it starts
`gpuplan serve` (tokenreview writes for the operator's ServiceAccount, audience
`gpuplan-estimator`; the chart's limits from values.yaml; SQLite file or `--postgres`) and the
operator watching three tenant namespaces, posting outcomes with a token minted for that
audience. A local HTTP server serves `--model-mib` models (a distinct one per URL).

1. Quiet: team-a and team-b each create `--honest-jobs` TrainingJobs (ResNet-50, distinct batch
   sizes), one per `--create-interval`; apply→planned of each (create call returned → first
   `Estimated=True` seen by a watch). Their Jobs finish and the operator posts their outcomes.
2. Restart: the estimator is stopped and started on the same database; its calibration outcome
   count, stored outcome rows and active bundle version (a bundle stored and activated at the
   start) before and after.
3. Hostile: team-c creates `--hostile-jobs` TrainingJobs pointing at the model URLs,
   `--skewing` jobs whose outcomes are far off their estimate (`SKEW_DATASET`) and
   `--preempted` jobs whose pods are evicted while running; `--hostile-lead` seconds later
   team-a and team-b create the quiet run's TrainingJobs again (new names), timed as in 1.
   Meanwhile team-c posts forged and replayed outcomes (`forged_posts`). Then the calibration
   is compared with the stated bound (`calibrating.tenant_factor_range`) and the restart of 2
   is repeated.

Throughout, the resident memory of the estimator's and the operator's process trees is sampled
against the chart's limits, and any exit the campaign did not cause is reported.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
import json
import math
import pathlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from campaigns import chaos, plan_latency, tenants
from campaigns import tenant_processes as tp
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_estimator.planning import calibrating
from gpuplan_testing import operator_harness as h

HONEST = ("team-a", "team-b")
HOSTILE = "team-c"
SYSTEM = "gpuplan-system"
OPERATOR_SA = "gpuplan-operator"
OPERATOR_SUBJECT = f"system:serviceaccount:{SYSTEM}:{OPERATOR_SA}"
LEAK_ENV = "LEAKED_TOKEN"
SKEW_DATASET = 2_000_000
"""team-c's skewing jobs claim 100x the honest dataset and finish as fast (3 s): their outcomes
say the estimates are far too long, pulling the factor down (kwok rewrites a container's
startedAt when it completes, so a run longer than the operator's 5 s requeue tolerance would
be labelled requeued and kept out: the campaign skews with fast runs)."""
_HTTP_TIMEOUT_S = 30


@dataclasses.dataclass(frozen=True)
class Settings:
    """One campaign's shape; `make abuse-full` uses the defaults."""

    honest_jobs: int = 10
    hostile_jobs: int = 1000
    skewing: int = 20
    preempted: int = 5
    forged_per_kind: int = 5
    model_mib: int = 64
    hostile_lead_s: float = 20.0
    create_interval_s: float = 1.0
    workers: int | None = None
    """Estimator workers; None: the chart's (values.yaml)."""
    wait_s: float = 600.0
    """Longest wait for plans, for the honest Jobs' outcomes and for the hostile outcomes."""
    source: pathlib.Path = chaos.ROOT
    """Tree whose `operator/` and `estimator/` run (another commit's, for a before/after)."""
    operator_cpus: str | None = None
    estimator_cpus: str | None = None
    """`taskset -c` lists the two run on (None: anywhere): on a small machine, what separate
    pods with their own CPU would see."""


# ------------------------------------------------------------------------------------ cluster

@dataclasses.dataclass(frozen=True)
class Tokens:
    """Bearer tokens the campaign holds: the operator's for the estimator (written to the file
    the operator reads), the same account's for the API server (what a pod mount or a Job's
    environment leaks) and team-c's own for the estimator's audience."""

    operator_file: pathlib.Path
    operator_ordinary: str
    tenant_for_estimator: str


def mint(core_v1: Any, namespace: str, account: str, audiences: list[str] | None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if audiences:
        spec["audiences"] = audiences
    answer = core_v1.create_namespaced_service_account_token(
        account, namespace, {"spec": spec}, _request_timeout=_HTTP_TIMEOUT_S)
    return str(answer.status.token)


def setup_cluster(api: client.ApiClient, workdir: pathlib.Path) -> Tokens:
    """Namespaces, the honest tenants' model ConfigMaps, ServiceAccounts and tokens."""
    core = client.CoreV1Api(api)
    for ns in (*HONEST, HOSTILE, SYSTEM):
        with contextlib.suppress(ApiException):
            core.create_namespace({"metadata": {"name": ns}}, _request_timeout=_HTTP_TIMEOUT_S)
    for ns in (*HONEST, HOSTILE):
        h.create_model_configmap(core, ns)
    for ns, account in ((SYSTEM, OPERATOR_SA), (HOSTILE, "tenant")):
        core.create_namespaced_service_account(ns, {"metadata": {"name": account}},
                                               _request_timeout=_HTTP_TIMEOUT_S)
    token_file = workdir / "operator-token"
    token_file.write_text(mint(core, SYSTEM, OPERATOR_SA, [tp.AUDIENCE]))
    return Tokens(token_file, mint(core, SYSTEM, OPERATOR_SA, None),
                  mint(core, HOSTILE, "tenant", [tp.AUDIENCE]))


def honest_job(name: str, batch: int) -> dict[str, Any]:
    body = h.trainingjob(name, succeed_after="3s")
    body["spec"]["training"].update(batchSize=batch, datasetSize=20_000)
    return body


def hostile_job(name: str, *, url: str | None = None, succeed_after: str = "3s",
                env: dict[str, str] | None = None, dataset_size: int = 20_000
                ) -> dict[str, Any]:
    body = honest_job(name, 64)
    body["spec"]["training"]["datasetSize"] = dataset_size
    body["spec"]["template"]["metadata"]["annotations"]["testbed.io/succeed-after"] = \
        succeed_after
    if url is not None:
        body["spec"]["model"] = {"onnx": {"url": url}}
    if env:
        body["spec"]["template"]["spec"]["containers"][0]["env"] = [
            {"name": k, "value": v} for k, v in env.items()]
    return body


class PlanWatch:
    """Times every TrainingJob of the cluster from its create call's return to the first watch
    event whose status says `Estimated=True`."""

    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.created: dict[tuple[str, str], float] = {}
        self.planned: dict[tuple[str, str], float] = {}
        self.succeeded: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(Exception):
                for event in watch.Watch().stream(
                        self.custom.list_cluster_custom_object, h.G, h.V, h.P,
                        timeout_seconds=5, _request_timeout=10):
                    self._seen(event["object"])
                    if self._stop.is_set():
                        return

    def _seen(self, obj: dict[str, Any]) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        if key not in self.planned and plan_latency.is_planned(obj):
            self.planned[key] = time.monotonic()
        if chaos.classify(obj) == "succeeded":
            self.succeeded.add(key)

    def create(self, namespace: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(h.G, h.V, namespace, h.P, body,
                                                    _request_timeout=_HTTP_TIMEOUT_S)
        self.created[(namespace, body["metadata"]["name"])] = time.monotonic()

    def latencies_s(self, keys: list[tuple[str, str]]) -> list[float]:
        return [self.planned[k] - self.created[k] for k in keys
                if k in self.planned and k in self.created]

    def __enter__(self) -> PlanWatch:
        self._thread.start()
        time.sleep(1.0)  # the watch is open before the first create
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()


def until(predicate: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(1.0)
    return True


# ---------------------------------------------------------------------------------- estimator

def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=_HTTP_TIMEOUT_S) as resp:
        return json.loads(resp.read())


def post_outcome(url: str, body: dict[str, Any], headers: dict[str, str]) -> int:
    request = urllib.request.Request(f"{url}/v1/outcomes", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=_HTTP_TIMEOUT_S) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """What an estimator restart must keep."""

    calibration_outcomes: int
    stored_outcomes: int
    bundle_version: int | None

    def __str__(self) -> str:
        return (f"calibration outcomes {self.calibration_outcomes}, stored rows "
                f"{self.stored_outcomes}, bundle version {self.bundle_version}")


def stored_outcomes(db_url: str) -> Any:
    with PerfStore.open(db_url) as store:
        return store.job_outcomes()


def snapshot(url: str, db_url: str) -> Snapshot:
    models = get_json(f"{url}/v1/models")
    return Snapshot(int(models["calibration"]["outcomes"]), len(stored_outcomes(db_url)),
                    models.get("bundle_version"))


def restart(estimator: tp.GuardedEstimator, sampler: tp.RssSampler, db_url: str,
            timeout_s: float) -> tuple[Snapshot, Snapshot]:
    before = snapshot(estimator.url, db_url)
    sampler.expected_down.add("estimator")
    estimator.stop()
    estimator.start()
    tp.wait_ready(estimator, estimator.ready, timeout_s, "estimator restart")
    sampler.expected_down.discard("estimator")
    return before, snapshot(estimator.url, db_url)


# ------------------------------------------------------------------------------ hostile tenant

def leaked_token(api: client.ApiClient) -> str | None:
    """The `LEAK_ENV` value of a Job the operator launched for team-c: a token taken from a
    Job's environment."""
    for job in client.BatchV1Api(api).list_namespaced_job(
            HOSTILE, _request_timeout=_HTTP_TIMEOUT_S).items:
        for container in job.spec.template.spec.containers:
            for env in container.env or []:
                if env.name == LEAK_ENV and env.value:
                    return str(env.value)
    return None


def forged_posts(url: str, tokens: Tokens, leaked: str | None, replayed_uid: str,
                 per_kind: int) -> dict[str, dict[int, int]]:
    """team-c's forged and replayed outcome posts, each kind `per_kind` times, naming team-a's
    namespace; statuses by kind."""
    kinds = {
        "no token": {},
        "team-c's own token for the estimator": {"Authorization":
                                                  f"Bearer {tokens.tenant_for_estimator}"},
        "operator's token from a Job's environment (API audience)": {
            "Authorization": f"Bearer {leaked or tokens.operator_ordinary}"},
        "no token, client header naming the operator": {"X-Gpuplan-Client": OPERATOR_SUBJECT},
        "garbage token": {"Authorization": "Bearer " + "x" * 900},
    }
    out: dict[str, dict[int, int]] = {}
    for kind, headers in kinds.items():
        statuses: dict[int, int] = {}
        for i in range(per_kind):
            uid = replayed_uid if kind.startswith("operator's") and i == 0 else f"forged-{i}"
            body = {"job_uid": uid, "gpu_type": "NVIDIA-L4", "gpu_count": 1,
                    "estimated_seconds": 10.0, "actual_seconds": 40.0,
                    "calibration_factor": 1.0, "namespace": HONEST[0]}
            status = post_outcome(url, body, headers)
            statuses[status] = statuses.get(status, 0) + 1
        out[kind] = statuses
    return out


def evict_running(api: client.ApiClient, names: list[str], timeout_s: float) -> int:
    """Evict the first running pod of each of team-c's TrainingJobs `names`; how many."""
    core = client.CoreV1Api(api)
    left = set(names)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        for pod in core.list_namespaced_pod(HOSTILE, _request_timeout=_HTTP_TIMEOUT_S).items:
            tj = (pod.metadata.labels or {}).get("gpuplan.io/trainingjob")
            if tj in left and pod.status.phase == "Running":
                with contextlib.suppress(ApiException):
                    core.create_namespaced_pod_eviction(pod.metadata.name, HOSTILE, {
                        "metadata": {"name": pod.metadata.name, "namespace": HOSTILE}},
                        _request_timeout=_HTTP_TIMEOUT_S)
                    left.discard(tj)
        time.sleep(1.0)
    return len(names) - len(left)


# -------------------------------------------------------------------------------- calibration

@dataclasses.dataclass(frozen=True)
class Moved:
    """A (device, train) factor the hostile tenant's outcomes reach, and the stated bound."""

    key: str
    before: float
    after: float
    low: float
    high: float
    hostile_outcomes: int

    @property
    def within(self) -> bool:
        return self.low <= self.after <= self.high


def calibration_moved(frame: Any, before: dict[str, float], after: dict[str, float]
                      ) -> list[Moved]:
    """For each device team-c has outcomes on: the factor before its outcomes and after, with
    the range `calibrating.tenant_factor_range` allows given every other tenant's outcomes (all
    devices: the mode and global levels above a device hold them all)."""
    settings = calibrating.CalibrationSettings()
    limit = settings.max_abs_log_ratio

    def clipped(est: float, act: float) -> float:
        return max(-limit, min(limit, math.log(act / est)))

    rows = list(zip(frame["device"], frame["namespace"], frame["estimated_seconds"],
                    frame["actual_seconds"], strict=True))
    others = [clipped(e, a) for _, ns, e, a in rows if ns != HOSTILE]
    out = []
    for device in sorted({d for d, ns, _, _ in rows if ns == HOSTILE}):
        key = f"{device}/train"
        namespaces = {ns for d, ns, _, _ in rows if d == device}
        low, high = calibrating.tenant_factor_range(others, len(namespaces), settings)
        out.append(Moved(key, before.get(key, before.get("*/train", 1.0)),
                         after.get(key, after.get("*/train", 1.0)), low, high,
                         sum(1 for d, ns, _, _ in rows if d == device and ns == HOSTILE)))
    return out


# ----------------------------------------------------------------------------------- campaign

@dataclasses.dataclass
class Report:
    """The campaign's figures; `table()` is what `make abuse-full` prints."""

    settings: Settings
    database: str = ""
    quiet_s: list[float] = dataclasses.field(default_factory=list)
    hostile_s: list[float] = dataclasses.field(default_factory=list)
    honest_planned: tuple[int, int] = (0, 0)
    hostile_created: int = 0
    hostile_planned: int = 0
    models_served: int = 0
    evicted: int = 0
    forged: dict[str, dict[int, int]] = dataclasses.field(default_factory=dict)
    leaked_from_job: bool = False
    forged_stored: int = 0
    preempted_stored: int = 0
    preempted_labels: dict[str, int] = dataclasses.field(default_factory=dict)
    moved: list[Moved] = dataclasses.field(default_factory=list)
    restarts: list[tuple[str, Snapshot, Snapshot]] = dataclasses.field(default_factory=list)
    peak_mib: dict[str, float] = dataclasses.field(default_factory=dict)
    exits: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    wall_s: float = 0.0
    log_dir: str = ""

    def table(self) -> str:
        q, x = p95(self.quiet_s), p95(self.hostile_s)
        accepted = sum(n for kinds in self.forged.values() for s, n in kinds.items()
                       if s in (200, 201))
        rows = [
            ("database", self.database),
            ("honest apply->planned p95 quiet s", f"{q:.3f} ({len(self.quiet_s)} plans)"),
            ("honest apply->planned p95 hostile s", f"{x:.3f} ({len(self.hostile_s)} plans)"),
            ("p95 ratio (target <= 1.5)", f"{x / q:.2f}" if q else "n/a"),
            ("hostile TrainingJobs created / planned",
             f"{self.hostile_created} / {self.hostile_planned} (model URLs "
             f"{self.settings.model_mib} MiB, {self.models_served} fetched)"),
            ("preempted (evicted while running)", f"{self.evicted} of "
                                                  f"{self.settings.preempted}; labelled "
                                                  f"{self.preempted_labels}; outcomes stored "
                                                  f"{self.preempted_stored}"),
            ("forged/replayed posts", "; ".join(f"{k}: {v}" for k, v in self.forged.items())),
            ("token read from a team-c Job's env", str(self.leaked_from_job)),
            ("forged writes accepted (answers / stored rows)",
             f"{accepted} / {self.forged_stored}"),
            *((f"calibration {m.key}", f"{m.before:.4f} -> {m.after:.4f} with "
               f"{m.hostile_outcomes} team-c outcomes, bound [{m.low:.4f}, {m.high:.4f}]: "
               f"{'within' if m.within else 'BEYOND'}") for m in self.moved),
            *((f"restart ({what})", f"before: {b}; after: {a}; "
               f"{'kept' if a == b else 'LOST'}") for what, b, a in self.restarts),
            *((f"peak RSS {name} MiB", f"{mib:.0f} of {tp.LIMIT_BYTES[name] / 2**20:.0f} "
               f"({'under' if mib * 2**20 < tp.LIMIT_BYTES[name] else 'OVER'} the limit)")
              for name, mib in self.peak_mib.items()),
            *((f"unexpected exits {name}", ", ".join(e) or "none")
              for name, e in self.exits.items()),
            ("wall s", f"{self.wall_s:.0f}"),
            ("logs", self.log_dir),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def p95(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100, method="inclusive")[94]


class Campaign:
    """One campaign on the testbed in `state`, with its database at `db_url`."""

    def __init__(self, s: Settings, state: dict[str, Any], db_url: str,
                 workdir: pathlib.Path) -> None:
        self.s, self.db_url, self.workdir = s, db_url, workdir
        self.kubeconfig = pathlib.Path(state["kubeconfig"])
        self.api = client.ApiClient(_configuration(self.kubeconfig))
        values = tp.chart_values()
        port = h.free_port()
        self.estimator = tp.GuardedEstimator(workdir, [*tp.pinned(s.estimator_cpus),
                                                       *tp.estimator_argv(
            values, port, h.free_port(), db_url, self.kubeconfig, OPERATOR_SUBJECT, s.workers)],
            port, s.source)
        self.values = values
        self.report = Report(s, database=db_url.split("@")[-1], log_dir=str(workdir))

    def _warm_up(self, watch_: PlanWatch, prefix: str) -> None:
        """One plan per estimator worker, so no measured plan waits for a worker's start."""
        workers = self.s.workers or int(self.values["estimator"]["workers"])
        keys = [(HONEST[0], f"{prefix}-{i}") for i in range(workers)]
        for i, (ns, name) in enumerate(keys):
            body = honest_job(name, 1000 + i)  # fails once planned: no outcome, no calibration
            body["spec"]["template"]["metadata"]["annotations"] = {"testbed.io/fail-after": "1s"}
            watch_.create(ns, body)
        until(lambda: all(k in watch_.planned for k in keys), self.s.wait_s)

    def _honest_run(self, watch_: PlanWatch, prefix: str) -> list[tuple[str, str]]:
        keys = []
        for i in range(self.s.honest_jobs):
            for t, ns in enumerate(HONEST):
                name = f"{prefix}-{i:03d}"
                watch_.create(ns, honest_job(name, 64 + 100 * t + i))
                keys.append((ns, name))
                time.sleep(self.s.create_interval_s / len(HONEST))
        until(lambda: all(k in watch_.planned for k in keys), self.s.wait_s)
        return keys

    def _hostile_flood(self, watch_: PlanWatch, models: tp.ModelServer) -> None:
        def create(i: int) -> None:
            with contextlib.suppress(ApiException):
                watch_.create(HOSTILE, hostile_job(f"big-{i:04d}", url=models.url(i)))
                self.report.hostile_created += 1

        with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
            list(pool.map(create, range(self.s.hostile_jobs)))

    def _hostile_runs(self, watch_: PlanWatch, tokens: Tokens) -> None:
        leak = {LEAK_ENV: tokens.operator_ordinary}
        for i in range(self.s.preempted):
            watch_.create(HOSTILE, hostile_job(f"pre-{i:03d}", succeed_after="60s", env=leak))
        for i in range(self.s.skewing):
            watch_.create(HOSTILE, hostile_job(f"skew-{i:03d}", dataset_size=SKEW_DATASET))

    def run(self) -> Report:
        started = time.monotonic()
        tokens = setup_cluster(self.api, self.workdir)
        _store_bundle(self.db_url)
        operator = tp.TenantOperator(self.workdir, [*HONEST, HOSTILE], tp.operator_env(
            self.values, self.kubeconfig, self.estimator.url, tokens.operator_file,
            self.s.source), cpus=self.s.operator_cpus)
        sampler = tp.RssSampler({"estimator": self.estimator, "operator": operator})
        blob = tp.large_model(self.s.model_mib * 2**20)
        try:
            with tp.ModelServer(blob) as models, sampler, PlanWatch(self.api) as watch_:
                self.estimator.start()
                tp.wait_ready(self.estimator, self.estimator.ready, 300, "estimator")
                operator.start()
                tp.wait_ready(operator, operator.started, 120, "operator")
                self._phases(watch_, models, tokens, sampler)
        finally:
            operator.stop()
            self.estimator.stop()
            self.report.peak_mib = {n: w.peak_mib for n, w in sampler.seen.items()}
            self.report.exits = {n: w.exits for n, w in sampler.seen.items()}
            self.report.wall_s = time.monotonic() - started
        return self.report

    def _phases(self, watch_: PlanWatch, models: tp.ModelServer, tokens: Tokens,
                sampler: tp.RssSampler) -> None:
        r = self.report
        self._warm_up(watch_, "warm")
        quiet = self._honest_run(watch_, "quiet")
        r.quiet_s = watch_.latencies_s(quiet)
        until(lambda: set(quiet) <= watch_.succeeded, self.s.wait_s)
        until(lambda: snapshot(self.estimator.url, self.db_url).stored_outcomes >= len(quiet),
              120)
        r.restarts.append(("after the quiet run",
                           *restart(self.estimator, sampler, self.db_url, 300)))
        self._warm_up(watch_, "rewarm")
        before = get_json(f"{self.estimator.url}/v1/models")["calibration"]["factors"]
        flood = threading.Thread(target=self._hostile_flood, args=(watch_, models), daemon=True)
        flood.start()
        self._hostile_runs(watch_, tokens)
        attack = threading.Thread(target=self._attack, args=(tokens,), daemon=True)
        attack.start()
        time.sleep(self.s.hostile_lead_s)
        hostile = self._honest_run(watch_, "again")
        r.hostile_s = watch_.latencies_s(hostile)
        r.honest_planned = (len(r.quiet_s), len(r.hostile_s))
        attack.join(timeout=self.s.wait_s)
        flood.join(timeout=self.s.wait_s)
        self._settle(watch_, hostile)
        r.models_served = models.served
        r.hostile_planned = sum(1 for ns, n in watch_.planned if ns == HOSTILE)
        frame = stored_outcomes(self.db_url)
        after = get_json(f"{self.estimator.url}/v1/models")["calibration"]["factors"]
        r.moved = calibration_moved(frame, before, after)
        r.forged_stored = sum(str(u).startswith("forged") for u in frame["job_uid"])
        r.restarts.append(("after the hostile run",
                           *restart(self.estimator, sampler, self.db_url, 300)))

    def _attack(self, tokens: Tokens) -> None:
        r = self.report
        pre = [f"pre-{i:03d}" for i in range(self.s.preempted)]
        r.evicted = evict_running(self.api, pre, self.s.wait_s / 2)
        leaked = leaked_token(self.api)
        r.leaked_from_job = leaked is not None
        replayed = str(stored_outcomes(self.db_url)["job_uid"].iloc[0])
        r.forged = forged_posts(self.estimator.url, tokens, leaked, replayed,
                                self.s.forged_per_kind)

    def _settle(self, watch_: PlanWatch, hostile: list[tuple[str, str]]) -> None:
        """Wait for the honest Jobs and team-c's skewing and preempted ones to finish, and the
        operator to post their outcomes."""
        pre = {f"pre-{i:03d}" for i in range(self.s.preempted)}
        runs = {(HOSTILE, n) for n in pre} | {(HOSTILE, f"skew-{i:03d}")
                                              for i in range(self.s.skewing)}
        until(lambda: set(hostile) <= watch_.succeeded and runs <= watch_.succeeded,
              self.s.wait_s)
        time.sleep(10.0)  # the last outcome posts
        frame = stored_outcomes(self.db_url)
        pre_jobs = _job_uids(self.api, pre)
        self.report.preempted_stored = sum(str(u) in pre_jobs for u in frame["job_uid"])
        self.report.preempted_labels = interruption_labels(self.api, pre)


def interruption_labels(api: client.ApiClient, names: set[str]) -> dict[str, int]:
    """How team-c's TrainingJobs `names` ended, by the interruption label the operator wrote
    in their Succeeded condition ("none": measured as one attempt)."""
    out: dict[str, int] = {}
    custom = client.CustomObjectsApi(api)
    for name in sorted(names):
        tj = custom.get_namespaced_custom_object(h.G, h.V, HOSTILE, h.P, name,
                                                 _request_timeout=_HTTP_TIMEOUT_S)
        message = ((chaos._condition(tj, "Succeeded") or {}).get("message") or "")
        label = message.split("interrupted (", 1)[1].split(")", 1)[0] \
            if "interrupted (" in message else ("none" if message else chaos.classify(tj))
        out[label] = out.get(label, 0) + 1
    return out


def _job_uids(api: client.ApiClient, trainingjobs: set[str]) -> set[str]:
    jobs = client.BatchV1Api(api).list_namespaced_job(HOSTILE, _request_timeout=_HTTP_TIMEOUT_S)
    return {str(j.metadata.uid) for j in jobs.items
            if (j.metadata.labels or {}).get("gpuplan.io/trainingjob") in trainingjobs}


def _configuration(kubeconfig: pathlib.Path) -> client.Configuration:
    from kubernetes import config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    configuration.connection_pool_maxsize = 32
    return configuration


def _install_crd(state: dict[str, Any]) -> None:
    h.install_crd(lambda *a: subprocess.run(
        [state["kubectl"], f"--kubeconfig={state['kubeconfig']}", *a], check=True,
        capture_output=True, text=True, timeout=120))


def _store_bundle(db_url: str) -> None:
    """The shipped bundle stored and activated in the database: what a restart must keep."""
    gpuplan = str(pathlib.Path(sys.executable).with_name("gpuplan"))
    subprocess.run([gpuplan, "models", "add", str(bundles.SHIPPED_BUNDLE), "--activate",
                    "--reason", "tenants campaign", "--db", db_url], check=True,
                   capture_output=True, timeout=300)


def main(argv: list[str] | None = None) -> int:
    d = Settings()
    parser = argparse.ArgumentParser(prog="campaigns.tenants_testbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--honest-jobs", type=int, default=d.honest_jobs,
                        help="TrainingJobs per honest tenant, per run")
    parser.add_argument("--hostile-jobs", type=int, default=d.hostile_jobs,
                        help="team-c's TrainingJobs pointing at model URLs")
    parser.add_argument("--skewing", type=int, default=d.skewing,
                        help="team-c's jobs whose outcomes pull the calibration")
    parser.add_argument("--preempted", type=int, default=d.preempted)
    parser.add_argument("--forged-per-kind", type=int, default=d.forged_per_kind)
    parser.add_argument("--model-mib", type=int, default=d.model_mib)
    parser.add_argument("--hostile-lead", type=float, default=d.hostile_lead_s,
                        metavar="SECONDS")
    parser.add_argument("--create-interval", type=float, default=d.create_interval_s,
                        metavar="SECONDS")
    parser.add_argument("--workers", type=int, default=None,
                        help="estimator workers (default: the chart's)")
    parser.add_argument("--wait", type=float, default=d.wait_s, metavar="SECONDS")
    parser.add_argument("--postgres", action="store_true",
                        help="PostgreSQL (tests/gpuplan_testing/postgres_server) for SQLite")
    parser.add_argument("--source", type=pathlib.Path, default=chaos.ROOT,
                        help="a tree with operator/ and estimator/ to run instead of this one's "
                             "(`git archive <commit> operator estimator | tar -x -C DIR`)")
    parser.add_argument("--state-dir", type=pathlib.Path,
                        default=chaos.ROOT / ".testbed-tenants",
                        help="private testbed state dir (started and stopped here)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the report here")
    parser.add_argument("--operator-cpus", metavar="LIST",
                        help="run the operator on these CPUs only (taskset -c LIST)")
    parser.add_argument("--estimator-cpus", metavar="LIST",
                        help="run the estimator and its workers on these CPUs only")
    args = parser.parse_args(argv)
    settings = Settings(args.honest_jobs, args.hostile_jobs, args.skewing, args.preempted,
                        args.forged_per_kind, args.model_mib, args.hostile_lead,
                        args.create_interval, args.workers, args.wait,
                        args.source.resolve(), args.operator_cpus, args.estimator_cpus)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="gpuplan-tenants-testbed-"))
    with (tenants.database(args.postgres, workdir, "tenants") as db_url,
          chaos.private_testbed(args.state_dir) as st):
        _install_crd(st)
        report = Campaign(settings, st, db_url, workdir).run()
    print(report.table())
    if args.json:
        args.json.write_text(json.dumps(dataclasses.asdict(report), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
