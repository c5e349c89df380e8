"""Kill-safety campaign for the operator on the real testbed (issue #21, item 4).

    PYTHONPATH=tests:testbed:hack .venv/bin/python -m campaigns.chaos --jobs 100   # `make chaos`

The operator (`python -m gpuplan_operator`) and the estimator (`gpuplan serve`) run as child
processes, so they can be SIGKILLed and restarted like a crashing pod. One campaign:

1. **Step kills.** Three TrainingJobs are created while an admission webhook of the campaign
   (`chaos_webhook`) holds the operator's *next* write open: the plan annotations of the first,
   the Job create of the other two. With the writes in flight the operator is SIGKILLed; the
   held writes are then refused, refused and allowed, so the cluster is exactly as a crash after
   the plan status, after the annotations and after the Job create leaves it. The webhook is
   removed and the operator restarted.
2. **Random kills.** N TrainingJobs are created while the operator is SIGKILLed at random moments
   after each restart, the estimator is SIGKILLed while a request is open (a TCP connection to
   it is established), and, with a private control plane, the kube-apiserver is SIGKILLed and
   restarted once.
3. **Quiescence and audit.** With everything running, wait until every TrainingJob is terminal or
   nothing changes; then count duplicate Jobs (more than one Job owned by a TrainingJob),
   TrainingJobs stuck without a terminal or launched state, and mismatches between a
   TrainingJob's status, its annotations and its Job.

`make chaos` starts a private testbed in `$TMPDIR/gpuplan-chaos-testbed` (the apiserver restart
must not disturb other test sessions); `tests/integration/test_operator_chaos.py` runs a small
slice on the shared testbed without the apiserver restart.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import pathlib
import random
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from testbed_pytest import wait_for  # testbed/ is on sys.path (pytest pythonpath, make chaos)

from campaigns import chaos_webhook
from gpuplan_testing import operator_harness as h

ROOT = pathlib.Path(__file__).resolve().parents[2]
PLAN_ANNOTATIONS = {"gpuType": "gpuplan.io/gpu-type", "gpuCount": "gpuplan.io/gpu-count"}
TERMINAL = ("Succeeded", "Failed")
TERMINAL_STATES = ("succeeded", "failed")
# The three reconcile steps, each a TrainingJob whose next write is held while the operator is
# killed: (held write, TrainingJob, whether the held write then happens).
STEPS = {
    "after-plan-status": ("annotations", "step-plan-status", False),
    "after-annotations": ("job", "step-annotations", False),
    "after-job-create": ("job", "step-job-created", True),
}
_HTTP_TIMEOUT = 15


# ------------------------------------------------------------------------------------ processes

class Child:
    """A child process in its own session, logging to a file; `kill()` is SIGKILL of the group."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str],
                 log: pathlib.Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with open(self.log, "ab") as out:
            out.write(f"\n=== start {self.starts + 1} {time.strftime('%T')}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=out,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         cwd=ROOT)
        self.starts += 1

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None

    def stop(self) -> None:
        """SIGTERM (a clean shutdown), SIGKILL if it does not exit."""
        self.kill(signal.SIGTERM)

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except FileNotFoundError:
            return ""


def _established(port: int) -> int:
    """Established TCP connections whose local port is `port` (requests open to a server)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in pathlib.Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    count += 1
    return count


class ServingChild(Child):
    """A child serving HTTP on `port` of the loopback, ready when `/readyz` answers 200."""

    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/readyz", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False


class Estimator(ServingChild):
    """`gpuplan serve` on a fixed port with its own SQLite database."""

    def __init__(self, workdir: pathlib.Path, source: pathlib.Path = ROOT) -> None:
        self.port = h.free_port()
        db = f"sqlite:///{workdir / 'perf.db'}"
        argv = [str(pathlib.Path(sys.executable).with_name("gpuplan")), "serve", "--host",
                "127.0.0.1", "--port", str(self.port), "--db", db, "--bundle-poll", "3600"]
        env = dict(os.environ, PYTHONPATH=str(source / "estimator"))
        super().__init__("estimator", argv, env, workdir / "estimator.log")

    def open_requests(self) -> int:
        return _established(self.port)


class Operator(Child):
    """`python -m gpuplan_operator --standalone -n <namespace>` (the chart's command)."""

    STARTED = "gpuplan operator started"

    def __init__(self, workdir: pathlib.Path, namespace: str, kubeconfig: pathlib.Path,
                 estimator_url: str, source: pathlib.Path = ROOT) -> None:
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), GPUPLAN_ESTIMATOR_URL=estimator_url,
                   GPUPLAN_METRICS_PORT="0", GPUPLAN_ESTIMATOR_TIMEOUT_SECONDS="20",
                   GPUPLAN_RETRY_BASE_DELAY_SECONDS="1", GPUPLAN_RETRY_MAX_DELAY_SECONDS="4",
                   PYTHONPATH=os.pathsep.join([str(source / "operator"),
                                               str(source / "estimator")]))
        argv = [sys.executable, "-m", "gpuplan_operator", "--standalone", "-n", namespace]
        super().__init__("operator", argv, env, workdir / "operator.log")

    def started(self) -> bool:
        """This start's log says the startup handler ran."""
        text = self.log_text()
        return self.STARTED in text[text.rfind("=== start"):]


class ControlPlane:
    """The testbed's kube-apiserver, restarted by SIGKILL (needs a private testbed)."""

    def __init__(self, state: dict[str, Any]) -> None:
        import testbed_procs  # testbed/ is on sys.path (pytest pythonpath, make chaos)
        from testbed_commands import apiserver_argv
        from testbed_common import Layout, Ports

        self._procs = testbed_procs
        self.layout = Layout(pathlib.Path(state["state_dir"]))
        self.argv = apiserver_argv(pathlib.Path(state["bin_dir"]), self.layout,
                                   Ports.from_dict(state["ports"]))
        self.api_server = str(state["api_server"])

    def restart_apiserver(self, timeout_s: float = 180.0) -> float:
        """SIGKILL the apiserver, start it again on the same etcd; returns seconds to ready."""
        record = self._procs.read_record(self.layout, "kube-apiserver")
        if record is None:
            raise RuntimeError("no kube-apiserver record in the testbed state")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(record["pid"]), signal.SIGKILL)
        deadline = time.monotonic() + 30
        while self._procs.is_alive(record) and time.monotonic() < deadline:
            self._procs._reap(int(record["pid"]))
            time.sleep(0.1)
        self._procs.start(self.layout, "kube-apiserver", self.argv)
        ctx = ssl.create_default_context(cafile=str(self.layout.pki_file("ca.crt")))
        ctx.load_cert_chain(str(self.layout.pki_file("admin.crt")),
                            str(self.layout.pki_file("admin.key")))
        seconds: float = self._procs.wait_until(
            self.layout, "kube-apiserver",
            lambda: self._procs.http_ok(f"{self.api_server}/readyz", ctx), timeout_s)
        return seconds


# ---------------------------------------------------------------------------------------- audit

@dataclasses.dataclass
class Audit:
    """What the cluster says after the campaign."""

    trainingjobs: int = 0
    jobs: int = 0
    duplicates: int = 0
    stuck: list[str] = dataclasses.field(default_factory=list)
    mismatches: list[str] = dataclasses.field(default_factory=list)
    states: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)

    @property
    def settled(self) -> bool:
        """Every TrainingJob's Job finished and recorded (the campaign's specs are all valid)."""
        return self.trainingjobs > 0 and sum(
            self.states[s] for s in TERMINAL_STATES) == self.trainingjobs

    def fingerprint(self) -> tuple[Any, ...]:
        return (self.jobs, self.duplicates, tuple(sorted(self.states.items())),
                tuple(self.stuck), tuple(self.mismatches))


def _condition(tj: dict[str, Any], type_: str) -> dict[str, Any] | None:
    for c in (tj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return None


def _job_finished(job: dict[str, Any]) -> str | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            return str(c["type"])
    return None


def classify(tj: dict[str, Any]) -> str:
    """succeeded | failed | launched | <Condition>=False:<reason> | pending."""
    for type_ in TERMINAL:
        c = _condition(tj, type_)
        if c and c.get("status") == "True":
            return type_.lower()
    launched, estimated = _condition(tj, "Launched"), _condition(tj, "Estimated")
    if launched and launched.get("status") == "True" and (tj.get("status") or {}).get("jobName"):
        return "launched"
    for cond in (launched, estimated):
        if cond and cond.get("status") == "False":
            return f"{cond['type']}=False:{cond.get('reason')}"
    return "pending"


def audit(api: client.ApiClient, namespace: str) -> Audit:
    """Duplicates, stuck TrainingJobs and status/annotation/Job mismatches in `namespace`."""
    custom, batch = client.CustomObjectsApi(api), client.BatchV1Api(api)
    tjs = custom.list_namespaced_custom_object(h.G, h.V, namespace, h.P,
                                               _request_timeout=_HTTP_TIMEOUT)["items"]
    jobs = batch.list_namespaced_job(namespace, _request_timeout=_HTTP_TIMEOUT).items
    owned: dict[str, list[Any]] = collections.defaultdict(list)
    for job in jobs:
        for ref in job.metadata.owner_references or []:
            if ref.kind == "TrainingJob":
                owned[ref.uid].append(job)
    out = Audit(trainingjobs=len(tjs), jobs=len(jobs))
    for tj in tjs:
        name, uid = tj["metadata"]["name"], tj["metadata"]["uid"]
        state = classify(tj)
        out.states[state] += 1
        if state not in TERMINAL_STATES:
            out.stuck.append(f"{name} ({state})")
        mine = owned.get(uid, [])
        out.duplicates += max(0, len(mine) - 1)
        out.mismatches += _mismatches(tj, state, [api.sanitize_for_serialization(j)
                                                  for j in mine])
    return out


def _mismatches(tj: dict[str, Any], state: str, jobs: list[dict[str, Any]]) -> list[str]:
    name = tj["metadata"]["name"]
    status = tj.get("status") or {}
    plan = status.get("plan") or {}
    found: list[str] = []
    annotations = tj["metadata"].get("annotations") or {}
    if plan and _condition(tj, "Estimated") and (_condition(tj, "Estimated") or {}).get(
            "status") == "True":
        for key, annotation in PLAN_ANNOTATIONS.items():
            if annotations.get(annotation) != str(plan.get(key)):
                found.append(f"{name}: annotation {annotation}={annotations.get(annotation)!r}"
                             f", status.plan.{key}={plan.get(key)!r}")
    job_name = status.get("jobName")
    if job_name and not jobs:
        found.append(f"{name}: status.jobName={job_name} but no Job owned by the TrainingJob")
    for job in jobs:
        jname = job["metadata"]["name"]
        if job_name is None:
            found.append(f"{name}: Job {jname} exists but status.jobName is unset ({state})")
        elif jname != job_name:
            found.append(f"{name}: status.jobName={job_name} but its Job is {jname}")
        jann = job["metadata"].get("annotations") or {}
        for key, annotation in PLAN_ANNOTATIONS.items():
            if plan and jann.get(annotation) != str(plan.get(key)):
                found.append(f"{name}: Job {jname} {annotation}={jann.get(annotation)!r}, "
                             f"status.plan.{key}={plan.get(key)!r}")
        finished = _job_finished(job)
        expected = {"Complete": "succeeded", "Failed": "failed", None: None}[finished]
        if expected != (state if state in ("succeeded", "failed") else None):
            found.append(f"{name}: Job {jname} is {finished or 'running'} but the TrainingJob "
                         f"is {state}")
    return found


# ------------------------------------------------------------------------------------- campaign

@dataclasses.dataclass(frozen=True)
class Settings:
    """One campaign's shape; `make chaos` uses the defaults."""

    jobs: int = 100
    operator_kills: int = 25
    estimator_kills: int = 3
    apiserver_restarts: int = 1
    step_kills: bool = True
    seed: int = 21
    create_interval_s: float = 0.05
    kill_after_s: tuple[float, float] = (0.0, 1.0)
    """A random fault lands this long (uniform) after a batch of TrainingJobs was created (the
    operator is up: each start waits for its startup log line)."""
    source: pathlib.Path = ROOT
    """Tree whose `operator/` and `estimator/` run: another commit's (`git archive`), to pin
    what is tested while the working tree changes, or to show what the campaign catches."""
    quiesce_timeout_s: float = 900.0
    stable_s: float = 120.0
    """Nothing changed for this long: quiescent even if some TrainingJob is not terminal (kopf
    retries an unexpected error after 60 s, so this must be longer)."""


@dataclasses.dataclass
class Report:
    """The campaign's figures; `table()` is what `make chaos` prints."""

    settings: Settings
    operator_kills: int = 0
    step_kills: list[str] = dataclasses.field(default_factory=list)
    estimator_kills: list[int] = dataclasses.field(default_factory=list)
    """Open requests at each estimator kill."""
    apiserver_restarts: int = 0
    apiserver_ready_s: float = 0.0
    unsettled_at_kills: list[int] = dataclasses.field(default_factory=list)
    """TrainingJobs not yet launched at each random operator kill."""
    operator_starts: int = 0
    created: int = 0
    audit: Audit = dataclasses.field(default_factory=Audit)
    quiesced_by: str = ""
    wall_s: float = 0.0
    log_dir: str = ""

    @property
    def ok(self) -> bool:
        a = self.audit
        return (a.duplicates == 0 and not a.stuck and not a.mismatches
                and a.trainingjobs == self.created and a.states["succeeded"] == self.created)

    def table(self) -> str:
        a = self.audit
        rows = [
            ("trainingjobs created", self.created),
            ("operator SIGKILLs (random)", self.operator_kills),
            ("  unlaunched TrainingJobs at each", " ".join(map(str, self.unsettled_at_kills))),
            ("operator SIGKILLs at a step", ", ".join(self.step_kills) or "0"),
            ("operator starts", self.operator_starts),
            ("estimator SIGKILLs (open requests)", f"{len(self.estimator_kills)} "
                                                   f"{self.estimator_kills}"),
            ("apiserver SIGKILL+restarts", f"{self.apiserver_restarts}" + (
                f" (ready again after {self.apiserver_ready_s:.1f} s)"
                if self.apiserver_restarts else "")),
            ("jobs", a.jobs),
            ("duplicate jobs", a.duplicates),
            ("stuck trainingjobs", len(a.stuck)),
            ("mismatches", len(a.mismatches)),
            ("states", ", ".join(f"{k} {v}" for k, v in sorted(a.states.items()))),
            ("quiesced by", self.quiesced_by),
            ("wall time", f"{self.wall_s:.0f} s"),
            ("logs", self.log_dir),
        ]
        width = max(len(k) for k, _ in rows)
        lines = [f"{k:<{width}}  {v}" for k, v in rows]
        lines += [f"  stuck: {n}" for n in a.stuck[:20]]
        lines += [f"  mismatch: {m}" for m in a.mismatches[:40]]
        lines.append("RESULT: " + ("PASS" if self.ok else "FAIL"))
        return "\n".join(lines)


def _retrying(fn: Callable[[], Any], timeout_s: float = 240.0) -> Any:
    """Call `fn` until it succeeds (the apiserver may be restarting); 409 counts as done."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return fn()
        except ApiException as exc:
            if exc.status == 409:
                return None
            if time.monotonic() > deadline or exc.status in (400, 403, 404, 422):
                raise
        except Exception:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.5)


class Campaign:
    """Runs one campaign in `namespace` (which must exist and be empty)."""

    def __init__(self, settings: Settings, api: client.ApiClient, kubeconfig: pathlib.Path,
                 namespace: str, workdir: pathlib.Path,
                 control_plane: ControlPlane | None = None) -> None:
        self.s, self.api, self.ns, self.workdir = settings, api, namespace, workdir
        self.control_plane = control_plane
        self.rng = random.Random(settings.seed)
        self.tjs = h.TrainingJobs(api, namespace)
        self.estimator = Estimator(workdir, settings.source)
        self.operator = Operator(workdir, namespace, kubeconfig, self.estimator.url,
                                 settings.source)
        self.report = Report(settings, log_dir=str(workdir))
        self._created = 0

    # -- processes
    def _start_operator(self) -> None:
        self.operator.start()
        self.report.operator_starts += 1
        wait_for(self.operator.started, 120, "the operator's startup log line")

    def _start_estimator(self) -> None:
        self.estimator.start()
        wait_for(self.estimator.ready, 120, "the estimator's /readyz")

    # -- objects
    def _setup(self) -> None:
        model = h.RESNET50.read_bytes()
        _retrying(lambda: h.create_model_configmap(client.CoreV1Api(self.api), self.ns,
                                                   data=model))

    def _create(self, name: str, annotations: dict[str, str] | None = None) -> None:
        body = h.trainingjob(name, succeed_after="2s")
        if annotations:
            body["metadata"]["annotations"] = annotations
        _retrying(lambda: self.tjs.create(body))
        self._created += 1

    # -- phases
    def step_kills(self) -> None:
        """SIGKILL the operator while its plan annotations, or its Job create, are in flight.

        The held write is then refused or allowed, leaving what a crash after the plan status,
        after the annotations and after the Job create leaves.
        """
        holds = {step: chaos_webhook.Hold(write, tj) for step, (write, tj, _) in STEPS.items()}
        holds["probe"] = chaos_webhook.Hold("job", "chaos-probe")
        adm = client.AdmissionregistrationV1Api(self.api)
        with chaos_webhook.HoldingWebhook(self.workdir) as hook:
            hook.install(adm, self.ns, holds)
            try:
                hook.release("probe", allow=False)
                wait_for(self._probe_refused, 60, "the holding webhook to be called")
                for _write, tj, _allow in STEPS.values():
                    self._create(tj)
                self._start_operator()
                wait_for(lambda: set(hook.held()) >= set(STEPS) or (
                    (hook.first_hold_age() or 0.0) > chaos_webhook.HOLD_LIMIT_S - 8), 300,
                         "the operator's writes to reach the holding webhook")
                held = set(hook.held())
                self.operator.kill()
                for step, (_write, _tj, allow) in STEPS.items():
                    answer = hook.release(step, allow=allow)
                    word = "never reached" if step not in held else (
                        "allowed" if answer else "refused")
                    self.report.step_kills.append(f"{step}: {word}")
            finally:
                hook.uninstall(adm)

    def _probe_refused(self) -> bool:
        job = {"metadata": {"name": "probe", "labels": {chaos_webhook.OWNER_LABEL: "chaos-probe"}},
               "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                   {"name": "c", "image": "x"}]}}}}
        try:
            client.BatchV1Api(self.api).create_namespaced_job(self.ns, job, dry_run="All",
                                                              _request_timeout=_HTTP_TIMEOUT)
        except ApiException as exc:
            return "chaos-webhook probe" in str(exc.body)
        return False

    def _create_batch(self, names: list[str]) -> None:
        for name in names:
            self._create(name)
            time.sleep(self.s.create_interval_s)

    def _unsettled(self) -> int:
        """TrainingJobs not launched yet: work a kill now interrupts (-1: API unreachable)."""
        try:
            items = client.CustomObjectsApi(self.api).list_namespaced_custom_object(
                h.G, h.V, self.ns, h.P, _request_timeout=_HTTP_TIMEOUT)["items"]
        except Exception:
            return -1
        return sum(classify(tj) not in ("launched", *TERMINAL_STATES) for tj in items)

    def _kill_estimator(self) -> None:
        open_now = self.estimator.open_requests()
        deadline = time.monotonic() + 15
        while open_now == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
            open_now = self.estimator.open_requests()
        self.estimator.kill()
        self.report.estimator_kills.append(open_now)
        time.sleep(self.rng.uniform(0.5, 3.0))  # the operator sees "connection refused" too
        self._start_estimator()

    def random_kills(self) -> None:
        """Before each fault, a batch of new TrainingJobs, so the fault lands mid-reconcile."""
        events = ["operator"] * self.s.operator_kills + ["estimator"] * self.s.estimator_kills
        self.rng.shuffle(events)
        if self.control_plane is not None:
            for _ in range(self.s.apiserver_restarts):
                events.insert(len(events) // 2, "apiserver")
        names = [f"cj-{i:03d}" for i in range(self.s.jobs)]
        k = len(events) + 1
        batches = [names[i * len(names) // k:(i + 1) * len(names) // k] for i in range(k)]
        if not self.operator.alive:
            self._start_operator()
        for i, event in enumerate(events):
            self._create_batch(batches[i])
            if event == "operator":
                time.sleep(self.rng.uniform(*self.s.kill_after_s))
                self.report.unsettled_at_kills.append(self._unsettled())
                self.operator.kill()
                self.report.operator_kills += 1
                time.sleep(self.rng.uniform(0.0, 1.0))
                self._start_operator()
            elif event == "estimator":
                self._kill_estimator()
            else:
                assert self.control_plane is not None
                time.sleep(self.rng.uniform(*self.s.kill_after_s))
                self.report.apiserver_restarts += 1
                self.report.apiserver_ready_s = self.control_plane.restart_apiserver()
        self._create_batch(batches[-1])

    def quiesce(self) -> None:
        deadline = time.monotonic() + self.s.quiesce_timeout_s
        last: tuple[Any, ...] | None = None
        since = time.monotonic()
        while True:
            try:
                current = audit(self.api, self.ns)
            except Exception:
                time.sleep(1)
                continue
            self.report.audit = current
            if current.settled and current.trainingjobs == self._created:
                self.report.quiesced_by = "every TrainingJob terminal"
                return
            if current.fingerprint() != last:
                last, since = current.fingerprint(), time.monotonic()
            elif time.monotonic() - since > self.s.stable_s:
                self.report.quiesced_by = f"no change for {self.s.stable_s:.0f} s"
                return
            if time.monotonic() > deadline:
                self.report.quiesced_by = f"timeout {self.s.quiesce_timeout_s:.0f} s"
                return
            time.sleep(2)

    def run(self) -> Report:
        started = time.monotonic()
        try:
            self._setup()
            self._start_estimator()
            if self.s.step_kills:
                self.step_kills()
            self._start_operator()
            self.random_kills()
            self.quiesce()
        finally:
            self.report.created = self._created
            self.operator.stop()
            self.estimator.stop()
            self.report.wall_s = time.monotonic() - started
        return self.report


# -------------------------------------------------------------------------------------- CLI

@contextlib.contextmanager
def private_testbed(state_dir: pathlib.Path) -> Iterator[dict[str, Any]]:
    """A testbed of our own (its apiserver gets killed), stopped afterwards."""
    import gpuplan_testbed as runner
    from testbed_common import Layout
    from testbed_lock import exclusive

    layout = Layout(state_dir.resolve())
    with exclusive(layout):
        state = runner.up(runner.Settings(state_dir=layout.state_dir), owner="pytest")
    try:
        yield state
    finally:
        with exclusive(layout):
            runner.down(layout)


@contextlib.contextmanager
def scratch_namespace(state: dict[str, Any], prefix: str
                      ) -> Iterator[tuple[client.ApiClient, pathlib.Path, str]]:
    """An API client, the kubeconfig and a new namespace on the testbed in `state`, with the
    TrainingJob CRD installed; the namespace is deleted afterwards."""
    kubeconfig = pathlib.Path(state["kubeconfig"])
    api = config.new_client_from_config(config_file=str(kubeconfig))
    kubectl = lambda *a: subprocess.run(  # noqa: E731
        [state["kubectl"], f"--kubeconfig={kubeconfig}", *a], check=True, capture_output=True,
        text=True, timeout=120)
    h.install_crd(kubectl)
    namespace = f"{prefix}-{int(time.time())}"
    client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}},
                                           _request_timeout=_HTTP_TIMEOUT)
    try:
        yield api, kubeconfig, namespace
    finally:
        with contextlib.suppress(Exception):
            client.CoreV1Api(api).delete_namespace(namespace, _request_timeout=_HTTP_TIMEOUT)
        api.close()


def run_on(state: dict[str, Any], settings: Settings, workdir: pathlib.Path,
           restart_apiserver: bool) -> Report:
    with scratch_namespace(state, "chaos") as (api, kubeconfig, namespace):
        campaign = Campaign(settings, api, kubeconfig, namespace, workdir,
                            ControlPlane(state) if restart_apiserver else None)
        return campaign.run()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="campaigns.chaos", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=Settings.jobs)
    parser.add_argument("--operator-kills", type=int, default=Settings.operator_kills)
    parser.add_argument("--estimator-kills", type=int, default=Settings.estimator_kills)
    parser.add_argument("--apiserver-restarts", type=int, default=Settings.apiserver_restarts)
    parser.add_argument("--no-step-kills", action="store_true")
    parser.add_argument("--seed", type=int, default=Settings.seed)
    parser.add_argument("--source", type=pathlib.Path, default=ROOT,
                        help="a tree with operator/ and estimator/ to run instead of this one's "
                             "(`git archive <commit> operator estimator | tar -x -C DIR`)")
    parser.add_argument("--state-dir", type=pathlib.Path,
                        default=pathlib.Path(tempfile.gettempdir()) / "gpuplan-chaos-testbed",
                        help="private testbed state dir (started and stopped here)")
    parser.add_argument("--workdir", type=pathlib.Path, default=None,
                        help="operator/estimator logs (default: a new temp dir, kept)")
    parser.add_argument("--json", type=pathlib.Path, help="also write the report here")
    args = parser.parse_args(argv)
    settings = Settings(jobs=args.jobs, operator_kills=args.operator_kills,
                        estimator_kills=args.estimator_kills,
                        apiserver_restarts=args.apiserver_restarts,
                        step_kills=not args.no_step_kills, seed=args.seed,
                        source=args.source.resolve())
    workdir = args.workdir or pathlib.Path(tempfile.mkdtemp(prefix="gpuplan-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    with private_testbed(args.state_dir) as state:
        report = run_on(state, settings, workdir, restart_apiserver=settings.apiserver_restarts > 0)
    print(report.table())
    if args.json:
        data = dataclasses.asdict(report)
        data["audit"]["states"] = dict(report.audit.states)
        args.json.write_text(json.dumps(data, indent=2, default=str) + "\n")
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
