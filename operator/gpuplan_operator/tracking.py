"""Pure: a batch/v1 Job object → its outcome (finished? succeeded? when?)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from gpuplan_operator import resources


@dataclasses.dataclass(frozen=True)
class JobOutcome:
    """How a finished Job ended: succeeded or not, when it ran, and a message."""

    succeeded: bool
    actual: resources.Actual
    message: str


def _condition(job: Mapping[str, Any], type_: str) -> Mapping[str, Any] | None:
    for c in (job.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def job_outcome(job: Mapping[str, Any]) -> JobOutcome | None:
    """The finished Job's outcome, or None while it runs.

    Failed Jobs have no completionTime, so their end is the Failed condition's transition time.
    """
    status = job.get("status") or {}
    complete, failed = _condition(job, "Complete"), _condition(job, "Failed")
    if complete is None and failed is None:
        return None
    start_text = status.get("startTime")
    if complete is not None:
        end_text = status.get("completionTime") or complete.get("lastTransitionTime")
        msg = f"Job completed ({status.get('succeeded', 0)} pod(s) succeeded)"
    else:
        assert failed is not None
        end_text = failed.get("lastTransitionTime")
        msg = f"Job failed: {failed.get('reason', '')} {failed.get('message', '')}".strip()
    if not start_text or not end_text:
        return None
    start, end = resources.parse_time(start_text), resources.parse_time(end_text)
    end = max(end, start)
    return JobOutcome(complete is not None, resources.Actual(start, end), msg)
