"""Pure: a namespace's ResourceQuotas → the GPUs and Jobs a new plan may still use.

`requests.nvidia.com/gpu` caps the GPUs of all pods of the namespace (quota on an extended
resource is only ever on requests), `count/jobs.batch` (or its short form `count/jobs`) the
Jobs. The remaining room is the tightest `hard - used` over every quota that names the
resource; quotas with a scope selector are skipped, since they bind only some pods.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from gpuplan_operator.core import gpu_accounting

GPU_QUOTA_KEY = f"requests.{gpu_accounting.GPU_RESOURCE}"
JOB_QUOTA_KEYS = ("count/jobs.batch", "count/jobs")


@dataclasses.dataclass(frozen=True)
class QuotaRoom:
    """Room left under the namespace's quotas; None where no quota limits it."""

    gpus: int | None
    gpu_quota: str
    """The quota whose GPU room is the tightest ("" when none)."""
    jobs: int | None
    job_quota: str

    def describe(self) -> str:
        """E.g. "ResourceQuota gpus leaves 8 of requests.nvidia.com/gpu"."""
        parts = []
        if self.gpus is not None:
            parts.append(f"ResourceQuota {self.gpu_quota} leaves {self.gpus} {GPU_QUOTA_KEY}")
        if self.jobs is not None:
            parts.append(f"ResourceQuota {self.job_quota} leaves {self.jobs} count/jobs")
        return "; ".join(parts)


def _quantity(raw: object) -> int | None:
    try:
        return gpu_accounting.parse_gpu_quantity(raw)
    except gpu_accounting.QuantityError:
        return None


def _room(quota: Mapping[str, Any], keys: Iterable[str]) -> int | None:
    hard = (quota.get("status") or {}).get("hard") or (quota.get("spec") or {}).get("hard") or {}
    used = (quota.get("status") or {}).get("used") or {}
    for key in keys:
        limit = _quantity(hard.get(key)) if key in hard else None
        if limit is not None:
            return max(limit - (_quantity(used.get(key, 0)) or 0), 0)
    return None


def quota_room(quotas: Iterable[Mapping[str, Any]]) -> QuotaRoom:
    """The tightest GPU and Job room over the namespace's unscoped ResourceQuotas."""
    gpus: tuple[int, str] | None = None
    jobs: tuple[int, str] | None = None
    for quota in quotas:
        spec = quota.get("spec") or {}
        if spec.get("scopes") or spec.get("scopeSelector"):
            continue
        name = str((quota.get("metadata") or {}).get("name", ""))
        gpu_room, job_room = _room(quota, (GPU_QUOTA_KEY,)), _room(quota, JOB_QUOTA_KEYS)
        if gpu_room is not None and (gpus is None or gpu_room < gpus[0]):
            gpus = (gpu_room, name)
        if job_room is not None and (jobs is None or job_room < jobs[0]):
            jobs = (job_room, name)
    return QuotaRoom(gpus=gpus[0] if gpus else None, gpu_quota=gpus[1] if gpus else "",
                     jobs=jobs[0] if jobs else None, job_quota=jobs[1] if jobs else "")


def capped_max_gpus(max_gpus: int, room: QuotaRoom) -> int:
    """The plan's GPU ceiling: the TrainingJob's `objective.maxGpus`, lowered to the quota's
    room (0 when the quota is spent: no plan, and the rejection names the quota)."""
    return max_gpus if room.gpus is None else min(max_gpus, room.gpus)

