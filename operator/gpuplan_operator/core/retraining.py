"""Pure: when to retrain the latency models, the training Job that does it, and how it ended.

Issue #17: after a benchmark Job succeeded with new rows, or every `interval_seconds` when a
schedule is set, one training Job runs ``gpuplan train --db $GPUPLAN_DB_URL --candidate
--promote`` in the estimator image. Its exit code is the outcome: 0 the candidate was promoted,
3 the promotion gate refused it (it stays a candidate), anything else a failure.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from gpuplan_estimator.core import exit_codes
from gpuplan_operator.core import benchmarks

COMPONENT = "retraining"
NAME_PREFIX = "gpuplan-retrain-"
TRIGGER_LABEL = "gpuplan.io/retraining-trigger"
CONTAINER = "train"
EXIT_REFUSED = int(exit_codes.ExitCode.INFEASIBLE)
"""`gpuplan train --promote` exits 3 when the gate refused the candidate."""
DEADLINE_SECONDS = 4 * 3600  # the full recipe on 2 cores takes tens of minutes; 4 h is a hang
TTL_SECONDS_AFTER_FINISHED = 86400
BACKOFF_LIMIT = 1
# A refusal is an answer, not a failure to retry: exit 3 ends the Job at once (its Failed
# condition names the rule, see `outcome`); preemptions are retried free.
POD_FAILURE_POLICY: dict[str, Any] = {"rules": [
    {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                          "values": [EXIT_REFUSED]}},
]}


class RetrainOutcome:
    """How a training Job ended: the `outcome` label of `gpuplan_retraining_jobs_total`."""

    PROMOTED = "promoted"
    REFUSED = "refused"
    FAILED = "failed"
    ALL = (PROMOTED, REFUSED, FAILED)


@dataclasses.dataclass(frozen=True)
class Trigger:
    """Why a training Job starts: a benchmark Job (its uid) or a schedule slot (its index)."""

    kind: str
    """"benchmark" or "schedule"."""
    key: str

    @property
    def digest(self) -> str:
        """Short sha256 of the trigger: the Job's name, so one trigger makes one Job (409)."""
        return hashlib.sha256(f"{self.kind}:{self.key}".encode()).hexdigest()[:12]


@dataclasses.dataclass(frozen=True)
class RetrainJobOptions:
    """What the chart decides for every training Job (settings `GPUPLAN_RETRAINING_*`)."""

    image: str
    """The estimator image (its entrypoint is `gpuplan`)."""
    db_secret: str
    max_rows: int
    """`gpuplan train --max-rows`: per-kernel row cap, bounding the Job's minutes and memory."""
    resources: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    image_pull_secrets: Sequence[str] = ()
    """Secret names for the pod's imagePullSecrets (the same as the benchmark Jobs')."""


def benchmark_triggers(finished: Iterable[benchmarks.FinishedJob],
                       new_rows: Mapping[str, bool], *,
                       last_training_unix: float | None) -> list[Trigger]:
    """A trigger per succeeded benchmark Job (oldest first) whose rows no training Job has read:
    it ended after the newest training Job started (`last_training_unix`; None: none ever did)
    and its type has new rows (`new_rows` by GPU type; a type it does not name counts as none).

    Derived from the Jobs on every pass rather than remembered, so a benchmark Job that ended
    while the operator was down still starts its training after a restart."""
    unread = [job for job in finished
              if job.outcome == benchmarks.BenchmarkOutcome.SUCCEEDED
              and new_rows.get(job.gpu_type, False)
              and (last_training_unix is None or job.finished_unix is None
                   or job.finished_unix > last_training_unix)]
    # Oldest first, so `next_trigger`'s newest is the last to end.
    unread.sort(key=lambda job: job.finished_unix or 0.0)
    return [Trigger("benchmark", job.uid) for job in unread]


def last_start_unix(jobs: Iterable[Mapping[str, Any]]) -> float | None:
    """When the newest of the training Jobs `jobs` was created; None when there is none."""
    stamps = [t for t in map(benchmarks.created_unix, jobs) if t is not None]
    return max(stamps, default=None)


def schedule_trigger(now_unix: float, interval_seconds: float) -> Trigger | None:
    """The schedule slot `now` falls in; None when no schedule is set (interval <= 0)."""
    if not interval_seconds > 0:
        return None
    return Trigger("schedule", str(math.floor(now_unix / interval_seconds)))


def next_trigger(pending: Sequence[Trigger], *, running: bool) -> Trigger | None:
    """The trigger to start a Job for now: one at a time, so none while one runs; the newest
    pending one otherwise (it sees every row the older ones would have)."""
    return None if running or not pending else pending[-1]


def train_args(options: RetrainJobOptions) -> list[str]:
    """The container's arguments to the image's `gpuplan` entrypoint ($(VAR) is expanded by
    the kubelet from the container's env, so the URL never appears in the Job spec)."""
    return ["train", "--db", "$(GPUPLAN_DB_URL)", "--candidate", "--promote",
            "--max-rows", str(options.max_rows)]


def job_name(trigger: Trigger) -> str:
    """The training Job's name: one per trigger, so a restarted operator finds it (409)."""
    return f"{NAME_PREFIX}{trigger.kind}-{trigger.digest}"


def build_job(trigger: Trigger, *, namespace: str, options: RetrainJobOptions) -> dict[str, Any]:
    """batch/v1 Job running the training for `trigger`, with the benchmark Jobs' non-root pod."""
    labels = {"app.kubernetes.io/name": "gpuplan", benchmarks.COMPONENT_LABEL: COMPONENT,
              "app.kubernetes.io/managed-by": "gpuplan-operator",
              TRIGGER_LABEL: f"{trigger.kind}-{trigger.digest}"}
    container = {
        "name": CONTAINER, "image": options.image, "args": train_args(options),
        "env": [{"name": "GPUPLAN_DB_URL",
                 "valueFrom": {"secretKeyRef": {"name": options.db_secret, "key": "url"}}},
                {"name": "HOME", "value": benchmarks.HOME},
                {"name": "TMPDIR", "value": benchmarks.SCRATCH_DIR},
                {"name": "XDG_CACHE_HOME", "value": f"{benchmarks.HOME}/.cache"}],
        "resources": {k: dict(v) for k, v in options.resources.items()},
        "securityContext": {"runAsNonRoot": True, "runAsUser": benchmarks.RUN_AS_UID,
                            "runAsGroup": benchmarks.RUN_AS_UID,
                            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "home", "mountPath": benchmarks.HOME},
                         {"name": "tmp", "mountPath": benchmarks.SCRATCH_DIR}],
    }
    pod = {
        "restartPolicy": "Never",
        # It reads its database URL from a Secret and never calls the API server (#16).
        "automountServiceAccountToken": False,
        "securityContext": {"runAsNonRoot": True, "runAsUser": benchmarks.RUN_AS_UID,
                            "runAsGroup": benchmarks.RUN_AS_UID, "fsGroup": benchmarks.RUN_AS_UID,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": [{"name": "home", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
        **benchmarks.pull_secrets(options.image_pull_secrets),
    }
    return {
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": job_name(trigger),
                     "namespace": namespace, "labels": labels},
        "spec": {"backoffLimit": BACKOFF_LIMIT, "podFailurePolicy": POD_FAILURE_POLICY,
                 "activeDeadlineSeconds": DEADLINE_SECONDS,
                 "ttlSecondsAfterFinished": TTL_SECONDS_AFTER_FINISHED,
                 "template": {"metadata": {"labels": dict(labels)}, "spec": pod}},
    }


def outcome(job: Mapping[str, Any]) -> str | None:
    """`RetrainOutcome` of a finished training Job from its conditions; None while it runs."""
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("status") != "True":
            continue
        if c.get("type") == "Complete":
            return RetrainOutcome.PROMOTED
        if c.get("type") == "Failed":
            found = benchmarks._EXIT_CODE.search(str(c.get("message") or ""))
            refused = (c.get("reason") == "PodFailurePolicy" and found is not None
                       and int(found.group(1)) == EXIT_REFUSED)
            return RetrainOutcome.REFUSED if refused else RetrainOutcome.FAILED
    return None


def finished_jobs(jobs: Iterable[Mapping[str, Any]]) -> list[tuple[str, str]]:
    """(uid, `RetrainOutcome`) of each finished training Job among `jobs`."""
    out = []
    for job in jobs:
        ended = outcome(job)
        if ended is not None:
            meta = job.get("metadata") or {}
            out.append((str(meta.get("uid") or meta.get("name")), ended))
    return out


def any_running(jobs: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a training Job has not finished yet (one at a time)."""
    return any(outcome(job) is None for job in jobs)
