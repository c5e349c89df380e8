"""Pure: which cluster GPU types need a benchmark Job, the Job for one, and how it ended.

Inputs are plain data: the GFD product labels present in the cluster (`inventory`), the
estimator's `GET /v1/coverage` answer keyed by catalog device, and a label → catalog-key resolver.
The Job follows `benchmark-jobs/job-template.yaml` (DESIGN §1 step 7, issue #17).
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors, exit_codes
from gpuplan_operator.core import gpu_accounting

COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "benchmark"
PRODUCT_LABEL = "gpuplan.io/gpu-product"
NAME_PREFIX = "gpuplan-bench-"
# prefix 14 + slug + "-yyyymmdd" 9 stays within the 63 characters of a pod's job-name label
MAX_SLUG_CHARS = 40
DEADLINE_MARGIN_SECONDS = 1800  # image pull, NVML probe and DB writes on top of the sweep budget
TTL_SECONDS_AFTER_FINISHED = 86400
BACKOFF_LIMIT = 2  # real failures; preemptions and evictions do not count (POD_FAILURE_POLICY)
CONTAINER = "bench"
# The image's user (benchmark-jobs/Dockerfile.cuda); numeric so runAsNonRoot can verify it.
RUN_AS_UID = 65532
HOME = "/home/gpuplan"
SCRATCH_DIR = "/tmp"
SWEEPS_DIR = "/sweeps"
# `gpuplan bench` exits 5 when its budget ran out before the plan was measured: the rows are
# stored and the next Job resumes the run, so retrying now would only spend more GPU time.
EXIT_BUDGET_SPENT = int(exit_codes.ExitCode.INCOMPLETE)
# A preempted or evicted pod gets the DisruptionTarget condition: retry it without counting
# against backoffLimit (the retry runs the same command, so it resumes the same run). Exit 5
# ends the Job at once; its Failed condition then names the rule (see `outcome`).
POD_FAILURE_POLICY: dict[str, Any] = {"rules": [
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                          "values": [EXIT_BUDGET_SPENT]}},
]}

Resolver = Callable[[str], "str | None"]


class Action:
    """What a GPU type's benchmark data calls for; the values are shown in logs."""

    OK = "Fresh"
    BUNDLED = "InBundle"
    MISSING = "NoData"
    STALE = "Stale"
    RUNNING = "BenchmarkRunning"
    UNKNOWN = "UnknownGpuType"


@dataclasses.dataclass(frozen=True)
class CoveredDevice:
    """One device of `GET /v1/coverage`."""

    measurements: int
    newest_run_unix: float | None
    in_bundle: bool
    bundle_rows: int | None = None
    """Rows the served bundle was trained on for this device; None when the estimator does not
    say (older estimators), and then `in_bundle` decides."""

    @property
    def bundle_covers(self) -> bool:
        """The served bundle learned this device: its rows when reported, else `in_bundle`."""
        return self.bundle_rows > 0 if self.bundle_rows is not None else self.in_bundle


@dataclasses.dataclass(frozen=True)
class GpuTypeCoverage:
    """Benchmark coverage of one cluster GPU type and the action it calls for."""

    gpu_type: str
    """The GFD label value (`nvidia.com/gpu.product`), the gauges' `gpu_type`."""
    device: str | None
    """Catalog key, None when the catalog does not know the label."""
    measurements: int
    """Rows in the performance database."""
    age_seconds: float | None
    """Age of the newest finished benchmark run; None without one."""
    action: str
    in_bundle: bool = False
    """The served bundle covers the type (`CoveredDevice.bundle_covers`): estimates for it use
    learned models even without rows in the database."""

    @property
    def needs_benchmark(self) -> bool:
        """Whether a benchmark Job should start for this type (no data, or stale data)."""
        return self.action in {Action.MISSING, Action.STALE}


def catalog_resolver(catalog: devices.Catalog) -> Resolver:
    """A Resolver from GFD label to catalog key; labels the catalog does not know give None."""
    def resolve(gpu_type: str) -> str | None:
        try:
            return catalog.resolve(gpu_type).key
        except errors.GpuplanError:
            return None
    return resolve


def assess(
    gpu_types: Iterable[str], coverage: Mapping[str, CoveredDevice], resolve: Resolver, *,
    now_unix: float, max_age_seconds: float, running: Iterable[str] = (),
) -> list[GpuTypeCoverage]:
    """One entry per distinct GPU type, sorted; `running` = types with an unfinished Job.

    A type is covered when the served bundle covers it or its measurements are fresh: the
    bundle's models are what estimates use, so a type it knows has data even before any
    benchmark ran in this cluster (issue #17: the operator used to ignore `in_bundle`).
    """
    busy = set(running)
    out = []
    for gpu_type in sorted(set(gpu_types)):
        device = resolve(gpu_type)
        cov = coverage.get(device) if device is not None else None
        out.append(_assess_one(gpu_type, device, cov, now_unix=now_unix,
                               max_age_seconds=max_age_seconds, busy=gpu_type in busy))
    return out


def _assess_one(gpu_type: str, device: str | None, cov: CoveredDevice | None, *,
                now_unix: float, max_age_seconds: float, busy: bool) -> GpuTypeCoverage:
    rows = cov.measurements if cov is not None else 0
    newest = cov.newest_run_unix if cov is not None else None
    age = max(now_unix - newest, 0.0) if newest is not None else None
    bundled = cov is not None and cov.bundle_covers
    fresh = rows > 0 and age is not None and age <= max_age_seconds
    if device is None:
        action = Action.UNKNOWN
    elif busy:
        action = Action.RUNNING
    elif fresh:
        action = Action.OK
    elif bundled:
        action = Action.BUNDLED
    elif rows == 0 or age is None:
        action = Action.MISSING
    else:
        action = Action.STALE
    return GpuTypeCoverage(gpu_type, device, rows, age, action, in_bundle=bundled)


def slug(gpu_type: str) -> str:
    """DNS-label-safe form of a GFD value; long values keep a digest so names stay distinct."""
    text = re.sub(r"[^a-z0-9]+", "-", gpu_type.lower()).strip("-") or "gpu"
    if len(text) <= MAX_SLUG_CHARS:
        return text
    digest = hashlib.sha256(gpu_type.encode()).hexdigest()[:8]
    return f"{text[:MAX_SLUG_CHARS - 9].rstrip('-')}-{digest}"


def job_name(gpu_type: str, day: datetime.date) -> str:
    """Deterministic per type and day: a restarted operator finds its Job (409), never a twin."""
    return f"{NAME_PREFIX}{slug(gpu_type)}-{day:%Y%m%d}"


def _finished(job: Mapping[str, Any]) -> bool:
    conditions = (job.get("status") or {}).get("conditions") or []
    return any(c.get("type") in {"Complete", "Failed"} and c.get("status") == "True"
               for c in conditions)


def running_gpu_types(jobs: Iterable[Mapping[str, Any]]) -> set[str]:
    """GPU types of benchmark Jobs that have not finished (their rows are still coming)."""
    return {
        str(((job.get("metadata") or {}).get("labels") or {}).get(PRODUCT_LABEL))
        for job in jobs
        if not _finished(job) and PRODUCT_LABEL in ((job.get("metadata") or {}).get("labels") or {})
    }


@dataclasses.dataclass(frozen=True)
class BenchmarkJobOptions:
    """What the chart decides for every benchmark Job (settings `GPUPLAN_BENCHMARK_*`)."""

    image: str
    db_secret: str
    budget_minutes: int
    backend: str = "torch"
    """`gpuplan bench --backend`: torch (eager forward+backward, what training jobs run) or
    onnxruntime (its CUDA execution provider)."""
    tolerations: Sequence[Mapping[str, Any]] = ()
    """Pod tolerations: GPU pools are usually tainted, and a Job without them stays Pending."""
    priority_class_name: str = ""
    """Pod priorityClassName; empty leaves the cluster's default."""
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Added to the GPU product label (which always wins: the Job measures that type)."""
    resources: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    """Container requests/limits (cpu, memory, ...); the one GPU limit is always set."""
    image_pull_secrets: Sequence[str] = ()
    """Secret names for the pod's imagePullSecrets (a private registry's credentials)."""


def pull_secrets(names: Sequence[str]) -> dict[str, Any]:
    """The pod spec's imagePullSecrets for `names`; nothing when there are none."""
    return {"imagePullSecrets": [{"name": n} for n in names]} if names else {}


def bench_args(options: BenchmarkJobOptions) -> list[str]:
    """The container's arguments to the image's `gpuplan` entrypoint.

    Fixed per Job, so a pod retried after a preemption runs the same command and `gpuplan bench`
    resumes the same run (its identity is the plan's digest, found in the database).
    """
    return ["bench", "--device", "cuda", "--backend", options.backend,
            "--budget-minutes", str(options.budget_minutes), "--sweep", SWEEPS_DIR]


def _resources(options: BenchmarkJobOptions) -> dict[str, Any]:
    out = {kind: dict(values) for kind, values in options.resources.items()}
    out["limits"] = {**out.get("limits", {}), gpu_accounting.GPU_RESOURCE: 1}
    if gpu_accounting.GPU_RESOURCE in out.get("requests", {}):
        out["requests"][gpu_accounting.GPU_RESOURCE] = 1
    return out


def _container(options: BenchmarkJobOptions) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": options.image,
        "args": bench_args(options),
        "env": [{"name": "GPUPLAN_DB_URL",
                 "valueFrom": {"secretKeyRef": {"name": options.db_secret, "key": "url"}}},
                # The root filesystem is read-only: everything written goes to the emptyDirs.
                {"name": "HOME", "value": HOME},
                {"name": "TMPDIR", "value": SCRATCH_DIR},
                {"name": "XDG_CACHE_HOME", "value": f"{HOME}/.cache"}],
        "resources": _resources(options),
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_UID,
                            "runAsGroup": RUN_AS_UID, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "home", "mountPath": HOME},
                         {"name": "tmp", "mountPath": SCRATCH_DIR}],
    }


def _pod_spec(gpu_type: str, options: BenchmarkJobOptions) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "restartPolicy": "Never",
        # It reads its database URL from a Secret and never calls the API server (#16).
        "automountServiceAccountToken": False,
        "nodeSelector": {**options.node_selector, gpu_accounting.GPU_PRODUCT_LABEL: gpu_type},
        "securityContext": {"runAsNonRoot": True, "runAsUser": RUN_AS_UID,
                            "runAsGroup": RUN_AS_UID, "fsGroup": RUN_AS_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [_container(options)],
        "volumes": [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
    }
    if options.tolerations:
        pod["tolerations"] = [dict(t) for t in options.tolerations]
    if options.priority_class_name:
        pod["priorityClassName"] = options.priority_class_name
    pod.update(pull_secrets(options.image_pull_secrets))
    return pod


def build_job(gpu_type: str, *, now: datetime.datetime, namespace: str,
              options: BenchmarkJobOptions) -> dict[str, Any]:
    """batch/v1 Job benchmarking one GPU type on one GPU, named per type and day."""
    labels = {"app.kubernetes.io/name": "gpuplan", COMPONENT_LABEL: COMPONENT,
              "app.kubernetes.io/managed-by": "gpuplan-operator", PRODUCT_LABEL: gpu_type}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(gpu_type, now.date()), "namespace": namespace,
                     "labels": labels},
        "spec": {
            "backoffLimit": BACKOFF_LIMIT,
            "podFailurePolicy": POD_FAILURE_POLICY,
            "activeDeadlineSeconds": options.budget_minutes * 60 + DEADLINE_MARGIN_SECONDS,
            "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": _pod_spec(gpu_type, options),
            },
        },
    }


class BenchmarkOutcome:
    """How a benchmark Job ended: the `outcome` label of `gpuplan_benchmark_jobs_total`."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BUDGET_SPENT = "budget_spent"
    ALL = (SUCCEEDED, FAILED, BUDGET_SPENT)


# The Job controller's message for a FailJob rule: "Container bench for pod ns/p failed with
# exit code 5 matching FailJob rule at index 1" (kubernetes
# pkg/controller/job/pod_failure_policy.go).
_EXIT_CODE = re.compile(r"\bexit code (\d+)\b")


@dataclasses.dataclass(frozen=True)
class FinishedJob:
    """A finished benchmark Job: its uid (to count it once), GPU type, outcome and end time."""

    uid: str
    gpu_type: str
    outcome: str
    finished_unix: float | None = None
    """When it ended (status.completionTime, else its condition's lastTransitionTime); None
    when the API gave neither."""


def outcome(job: Mapping[str, Any]) -> str | None:
    """`BenchmarkOutcome` of a finished Job from its conditions; None while it runs."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return BenchmarkOutcome.SUCCEEDED
        if c.get("type") == "Failed":
            found = _EXIT_CODE.search(str(c.get("message") or ""))
            budget = (c.get("reason") == "PodFailurePolicy" and found is not None
                      and int(found.group(1)) == EXIT_BUDGET_SPENT)
            return BenchmarkOutcome.BUDGET_SPENT if budget else BenchmarkOutcome.FAILED
    return None


def finished_jobs(jobs: Iterable[Mapping[str, Any]]) -> list[FinishedJob]:
    """The finished benchmark Jobs among `jobs` (those without a product label are skipped)."""
    out = []
    for job in jobs:
        meta = job.get("metadata") or {}
        gpu_type = (meta.get("labels") or {}).get(PRODUCT_LABEL)
        ended = outcome(job)
        if gpu_type is None or ended is None:
            continue
        out.append(FinishedJob(str(meta.get("uid") or meta.get("name")), str(gpu_type), ended,
                               finished_unix(job)))
    return out


def finished_unix(job: Mapping[str, Any]) -> float | None:
    """When a finished Job ended, as Unix seconds: completionTime, else the lastTransitionTime
    of its Complete/Failed condition; None when neither is given."""
    status = job.get("status") or {}
    stamps = [status.get("completionTime")] + [
        c.get("lastTransitionTime") for c in status.get("conditions") or []
        if c.get("type") in {"Complete", "Failed"} and c.get("status") == "True"]
    for stamp in stamps:
        if isinstance(stamp, str) and stamp:
            return _unix(stamp)
    return None


def created_unix(job: Mapping[str, Any]) -> float | None:
    """A Job's metadata.creationTimestamp as Unix seconds; None when absent."""
    stamp = (job.get("metadata") or {}).get("creationTimestamp")
    return _unix(stamp) if isinstance(stamp, str) and stamp else None


def _unix(rfc3339: str) -> float:
    # Kubernetes writes RFC 3339 UTC with a trailing Z.
    return datetime.datetime.fromisoformat(rfc3339.replace("Z", "+00:00")).timestamp()
