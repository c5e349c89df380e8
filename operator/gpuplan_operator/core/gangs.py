"""Pure: living beside other schedulers: which scheduler a pod gets, gang PodGroups, and what
gpuplan tells schedulers (Kueue's maximum execution time, relative GPU speeds).

A multi-node plan is one gang: its pods start together or not at all. Kueue admits the Job as
one Workload (`kueue`); without Kueue, the PodGroup of a gang scheduler the cluster serves does
it. Each scheduler reads its own PodGroup API and its own pod key (their documentation and
source, read 2026-11-28):

- KAI Scheduler `scheduling.run.ai/v2alpha2`: pod annotation `pod-group-name`, and the PodGroup
  names the KAI queue (the pod label `kai.scheduler/queue` the tenant set).
- Volcano `scheduling.volcano.sh/v1beta1`: pod annotation `scheduling.k8s.io/group-name`, queue
  from the pod annotation `scheduling.volcano.sh/queue-name` (else Volcano's `default`).
- scheduler-plugins coscheduling `scheduling.x-k8s.io/v1alpha1`: pod label
  `scheduling.x-k8s.io/pod-group`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

SCHEDULER_OPT_IN_LABEL = "gpuplan.io/scheduler"
"""Namespace label that opts its TrainingJobs into gpuplan-scheduler (value `enabled`)."""
SCHEDULER_OPT_IN_VALUE = "enabled"
MAX_EXEC_TIME_LABEL = "kueue.x-k8s.io/max-exec-time-seconds"
"""Kueue's maximum execution time of a Job (Kueue `pkg/constants.MaxExecTimeSecondsLabel`):
Kueue deactivates the Workload once it ran this long in total."""
RELATIVE_SPEED_ANNOTATION = "gpuplan.io/relative-speed"
"""JSON object: each planned GPU type's predicted speed over the plan's type's (1.0)."""


@dataclasses.dataclass(frozen=True)
class PodGroupApi:
    """One gang scheduler's PodGroup API and the pod key naming a pod's group."""

    scheduler: str
    group: str
    version: str
    plural: str
    pod_key: str
    pod_key_is_label: bool
    queue_from: str
    """Pod label or annotation key the tenant names the queue with (`queue_of`); empty when
    the PodGroup names none."""
    default_queue: str


PODGROUP_APIS: tuple[PodGroupApi, ...] = (
    PodGroupApi("kai", "scheduling.run.ai", "v2alpha2", "podgroups", "pod-group-name", False,
                "kai.scheduler/queue", ""),
    PodGroupApi("volcano", "scheduling.volcano.sh", "v1beta1", "podgroups",
                "scheduling.k8s.io/group-name", False, "scheduling.volcano.sh/queue-name",
                "default"),
    PodGroupApi("coscheduling", "scheduling.x-k8s.io", "v1alpha1", "podgroups",
                "scheduling.x-k8s.io/pod-group", True, "", ""),
)
"""In order of preference when a cluster serves several."""


def scheduler_for(template_scheduler: str | None, configured: str, *, scope: str,
                  namespace_labels: Mapping[str, str], tj_opt_in: bool | None) -> str | None:
    """The schedulerName to set on the pods, None to leave the template's (the tenant's, or the
    default scheduler). A tenant's choice always wins; gpuplan-scheduler only where opted in
    (`Settings.scheduler_scope`): the plan's node affinity alone already places the pods."""
    if template_scheduler or not configured or tj_opt_in is False:
        return None
    if scope == "all" or tj_opt_in:
        return configured
    opted = namespace_labels.get(SCHEDULER_OPT_IN_LABEL) == SCHEDULER_OPT_IN_VALUE
    return configured if opted else None


def first_served(served_groups: Iterable[str]) -> PodGroupApi | None:
    """The preferred PodGroup API among the API group/versions the cluster serves
    (`group/version` strings, as API discovery lists them)."""
    served = set(served_groups)
    return next((api for api in PODGROUP_APIS if f"{api.group}/{api.version}" in served), None)


def queue_of(api: PodGroupApi, pod_meta: Mapping[str, Any]) -> str:
    """The queue the tenant named on the pod template for `api`'s scheduler, else its default."""
    if not api.queue_from:
        return ""
    for where in ("labels", "annotations"):
        value = (pod_meta.get(where) or {}).get(api.queue_from)
        if isinstance(value, str) and value:
            return value
    return api.default_queue


def build_podgroup(api: PodGroupApi, *, name: str, namespace: str, min_member: int,
                   queue: str, owner_references: Sequence[Mapping[str, Any]],
                   labels: Mapping[str, str]) -> dict[str, Any]:
    """The gang's PodGroup: admitted when all `min_member` pods fit."""
    spec: dict[str, Any] = {"minMember": min_member}
    if queue:
        spec["queue"] = queue
    return {
        "apiVersion": f"{api.group}/{api.version}", "kind": "PodGroup",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels),
                     "ownerReferences": [dict(o) for o in owner_references]},
        "spec": spec,
    }


def join_podgroup(api: PodGroupApi, pod_meta: dict[str, Any], name: str) -> None:
    """Mark a pod template as a member of PodGroup `name` the way `api`'s scheduler reads it."""
    where = "labels" if api.pod_key_is_label else "annotations"
    pod_meta.setdefault(where, {})[api.pod_key] = name


def max_exec_time_s(p90_seconds: float, margin: float) -> int | None:
    """Kueue's maximum execution time for a plan: its P90 runtime x `margin`, whole seconds
    rounded up; None when `margin` is 0 (off)."""
    if margin == 0:
        return None
    return max(1, math.ceil(p90_seconds * margin))


def relative_speeds(plan_gpu_type: str, plan_seconds: float,
                    alternatives: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each GPU type's predicted speed over the plan's own (1.0): its fastest candidate's
    time divided into the plan's, rounded to 3 digits. A type's fastest candidate stands for
    it, as a scheduler placing the job there would pick it."""
    best: dict[str, float] = {plan_gpu_type: plan_seconds}
    for alt in alternatives:
        gpu_type, seconds = alt.get("gpuType"), alt.get("estimatedSeconds")
        if isinstance(gpu_type, str) and isinstance(seconds, int | float) and seconds > 0:
            best[gpu_type] = min(best.get(gpu_type, math.inf), float(seconds))
    base = best[plan_gpu_type]
    return {t: round(base / s, 3) for t, s in sorted(best.items())}
