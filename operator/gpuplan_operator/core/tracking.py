"""Pure: a batch/v1 Job object and its pods → its outcome (finished? succeeded? when?)."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Iterable, Mapping
from typing import Any

from gpuplan_operator.core import resources


class StartSource:
    """Where the measured start of a run came from, best first."""

    CONTAINER = "first container start"
    POD = "first pod start"
    JOB = "Job start"


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How a finished Job ended: succeeded or not, when it ran, and a message."""

    succeeded: bool
    actual: resources.Actual
    message: str
    start_source: str
    """A StartSource: what `actual.start_time` was read from."""
    attempt_start: datetime.datetime | None = None
    """Start of the attempt that finished (its pods' latest container start); None: unknown,
    the run's start stands in."""
    interruptions: tuple[str, ...] = ()
    """What interrupted the run before the attempt that finished (`Interruption`); a run with
    any is not a measurement of training (issue #33)."""

    @property
    def training_seconds(self) -> float:
        """Seconds of the attempt that finished: its start to the run's end."""
        start = self.attempt_start or self.actual.start_time
        return max((self.actual.completion_time - start).total_seconds(), 0.0)

    @property
    def measures_training(self) -> bool:
        """True when the run can calibrate: succeeded, uninterrupted."""
        return self.succeeded and not self.interruptions


class Interruption:
    """Why a run is not one uninterrupted attempt (labels, in condition messages and events)."""

    RETRIED = "retried"
    """Pods failed before the one that finished (the Job's backoff)."""
    RESTARTED = "restarted"
    """A container restarted in place."""
    PREEMPTED = "preempted"
    """A pod was preempted or evicted (DisruptionTarget, or reason Evicted/Preempting)."""
    REQUEUED = "requeued"
    """An earlier attempt ran (a container started before this attempt's) and nothing else
    explains it: suspended and resumed by a queue (Kueue deletes the pods)."""


DISRUPTION_REASONS = frozenset({"Evicted", "Preempting", "PreemptionByScheduler",
                                "EvictionByEvictionAPI", "TerminationByKubelet",
                                "DeletionByTaintManager", "PreemptionByKueue"})
REQUEUE_TOLERANCE_S = 5.0
"""An earlier container start by more than this is an earlier attempt (a multi-pod attempt's
pods start within seconds of each other)."""


def _container_starts(pod: Mapping[str, Any], key: str) -> list[datetime.datetime]:
    out = []
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        for phase in ("running", "terminated"):
            started = ((status.get(key) or {}).get(phase) or {}).get("startedAt")
            if started:
                out.append(resources.parse_time(str(started)))
    return out


def attempt_start(pods: Iterable[Mapping[str, Any]]) -> datetime.datetime | None:
    """Start of the attempt that finished: over the Succeeded pods, the earliest of each pod's
    latest container start (a container restarted in place keeps only its last start in
    `state`)."""
    starts = [max(found) for pod in pods
              if (pod.get("status") or {}).get("phase") == "Succeeded"
              and (found := _container_starts(pod, "state"))]
    return min(starts, default=None)


def interruptions(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]],
                  first_start: datetime.datetime | None,
                  this_attempt: datetime.datetime | None) -> tuple[str, ...]:
    """What interrupted the run (`Interruption` labels, sorted), from the Job, its pods and
    the first container start seen while it ran."""
    pods = list(pods)
    found = set()
    if int((job.get("status") or {}).get("failed") or 0) > 0:
        found.add(Interruption.RETRIED)
    for pod in pods:
        status = pod.get("status") or {}
        if any(int(c.get("restartCount") or 0) > 0 for c in status.get("containerStatuses") or []):
            found.add(Interruption.RESTARTED)
        reasons = {status.get("reason")} | {
            c.get("reason") for c in status.get("conditions") or []
            if c.get("type") == "DisruptionTarget" and c.get("status") == "True"}
        if reasons & DISRUPTION_REASONS:
            found.add(Interruption.PREEMPTED)
    # An earlier attempt that nothing above explains: suspended and resumed by a queue.
    if not found and first_start is not None and this_attempt is not None and \
            (this_attempt - first_start).total_seconds() > REQUEUE_TOLERANCE_S:
        found.add(Interruption.REQUEUED)
    return tuple(sorted(found))


def _condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def first_container_start(pods: Iterable[Mapping[str, Any]]) -> datetime.datetime | None:
    """The earliest `startedAt` of any (non-init) container of `pods`, current or last state.

    A finished container keeps its start under `terminated.startedAt`, a restarted one under
    `lastState`; init containers are left out (they run before training, e.g. a download).
    """
    starts = []
    for pod in pods:
        for status in (pod.get("status") or {}).get("containerStatuses") or []:
            for key in ("state", "lastState"):
                for phase in ("running", "terminated"):
                    started = ((status.get(key) or {}).get(phase) or {}).get("startedAt")
                    if started:
                        starts.append(resources.parse_time(str(started)))
    return min(starts, default=None)


def _first_pod_start(pods: Iterable[Mapping[str, Any]]) -> datetime.datetime | None:
    starts = [resources.parse_time(str(t)) for p in pods
              if (t := (p.get("status") or {}).get("startTime"))]
    return min(starts, default=None)


def job_outcome(job: Mapping[str, Any], pods: Iterable[Mapping[str, Any]] = (),
                observed_start: datetime.datetime | None = None) -> JobOutcome | None:
    """The finished Job's outcome, or None while it runs.

    The run is measured from the first container start, so queueing, scheduling and image
    pulls do not count as training time: the earliest of `observed_start` (a container start
    seen while the Job ran, whose pod may be gone since) and the starts on `pods`. The pods'
    start, then the Job's, stand in when neither is known. Failed Jobs have no
    completionTime, so their end is the Failed condition's transition time.
    """
    pods = list(pods)
    status = job.get("status") or {}
    complete, failed = _condition(job, "Complete"), _condition(job, "Failed")
    if complete is None and failed is None:
        return None
    if complete is not None:
        end_text = status.get("completionTime") or complete.get("lastTransitionTime")
        msg = f"Job completed ({status.get('succeeded', 0)} pod(s) succeeded)"
    else:
        assert failed is not None
        end_text = failed.get("lastTransitionTime")
        msg = f"Job failed: {failed.get('reason', '')} {failed.get('message', '')}".strip()
    job_start = status.get("startTime")
    candidates = (
        (StartSource.CONTAINER, min(filter(None, (first_container_start(pods), observed_start)),
                                    default=None)),
        (StartSource.POD, _first_pod_start(pods)),
        (StartSource.JOB, resources.parse_time(job_start) if job_start else None),
    )
    source, start = next(((s, t) for s, t in candidates if t is not None), ("", None))
    if start is None or not end_text:
        return None
    end = max(resources.parse_time(end_text), start)
    this_attempt = attempt_start(pods) if complete is not None else None
    first = start if source == StartSource.CONTAINER else None
    interrupted = interruptions(job, pods, first, this_attempt)
    # One uninterrupted attempt started with the run: its first container start, noted while
    # it ran, stands (a finished pod's startedAt may be rewritten at termination).
    return JobOutcome(complete is not None, resources.Actual(start, end), msg, source,
                      attempt_start=this_attempt if interrupted else None,
                      interruptions=interrupted)
