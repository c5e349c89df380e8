"""Pure: which cluster GPU types need a benchmark Job, and the Job for one (DESIGN §1 step 7).

Inputs are plain data: the GFD product labels present in the cluster (`inventory`), the
estimator's `GET /v1/coverage` answer keyed by catalog device, and a label → catalog-key resolver.
The Job follows `benchmark-jobs/job-template.yaml`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_operator import gpu_accounting

COMPONENT_LABEL = "app.kubernetes.io/component"
COMPONENT = "benchmark"
PRODUCT_LABEL = "gpuplan.io/gpu-product"
NAME_PREFIX = "gpuplan-bench-"
# prefix 14 + slug + "-yyyymmdd" 9 stays within the 63 characters of a pod's job-name label
MAX_SLUG_CHARS = 40
DEADLINE_MARGIN_SECONDS = 1800  # image pull, NVML probe and DB writes on top of the sweep budget
TTL_SECONDS_AFTER_FINISHED = 86400

Resolver = Callable[[str], "str | None"]


class Action:
    """What a GPU type's benchmark data calls for; the values are shown in logs."""

    OK = "Fresh"
    MISSING = "NoData"
    STALE = "Stale"
    RUNNING = "BenchmarkRunning"
    UNKNOWN = "UnknownGpuType"


@dataclasses.dataclass(frozen=True)
class DeviceCoverage:
    """One device of `GET /v1/coverage`."""

    measurements: int
    newest_run_unix: float | None
    in_bundle: bool


@dataclasses.dataclass(frozen=True)
class GpuTypeCoverage:
    """Benchmark coverage of one cluster GPU type and the action it calls for."""

    gpu_type: str
    """The GFD label value (`nvidia.com/gpu.product`), the gauges' `gpu_type`."""
    device: str | None
    """Catalog key, None when the catalog does not know the label."""
    measurements: int
    age_seconds: float | None
    """Age of the newest finished benchmark run; None without one."""
    action: str

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
    gpu_types: Iterable[str], coverage: Mapping[str, DeviceCoverage], resolve: Resolver, *,
    now_unix: float, max_age_seconds: float, running: Iterable[str] = (),
) -> list[GpuTypeCoverage]:
    """One entry per distinct GPU type, sorted; `running` = types with an unfinished Job."""
    busy = set(running)
    out = []
    for gpu_type in sorted(set(gpu_types)):
        device = resolve(gpu_type)
        cov = coverage.get(device) if device is not None else None
        rows = cov.measurements if cov is not None else 0
        newest = cov.newest_run_unix if cov is not None else None
        age = max(now_unix - newest, 0.0) if newest is not None else None
        if device is None:
            action = Action.UNKNOWN
        elif gpu_type in busy:
            action = Action.RUNNING
        elif rows == 0 or age is None:
            action = Action.MISSING
        elif age > max_age_seconds:
            action = Action.STALE
        else:
            action = Action.OK
        out.append(GpuTypeCoverage(gpu_type, device, rows, age, action))
    return out


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


def build_job(
    gpu_type: str, *, now: datetime.datetime, namespace: str, image: str, db_secret: str,
    budget_minutes: int,
) -> dict[str, Any]:
    """batch/v1 Job benchmarking one GPU type on one GPU, named per type and day."""
    labels = {"app.kubernetes.io/name": "gpuplan", COMPONENT_LABEL: COMPONENT,
              "app.kubernetes.io/managed-by": "gpuplan-operator", PRODUCT_LABEL: gpu_type}
    container = {
        "name": "bench",
        "image": image,
        "args": ["bench", "--device", "cuda", "--budget-minutes", str(budget_minutes),
                 "--sweep", "/sweeps"],
        "env": [{"name": "GPUPLAN_DB_URL",
                 "valueFrom": {"secretKeyRef": {"name": db_secret, "key": "url"}}}],
        "resources": {"limits": {gpu_accounting.GPU_RESOURCE: 1}},
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name(gpu_type, now.date()), "namespace": namespace,
                     "labels": labels},
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": budget_minutes * 60 + DEADLINE_MARGIN_SECONDS,
            "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {gpu_accounting.GPU_PRODUCT_LABEL: gpu_type},
                    "containers": [container],
                },
            },
        },
    }
