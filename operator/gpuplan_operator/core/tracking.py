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
    return JobOutcome(complete is not None, resources.Actual(start, end), msg, source)
