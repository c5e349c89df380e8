"""A slice of the kill-safety campaign (`make chaos` runs the full one, docs in
`hack/campaigns/chaos.py`): the real operator and estimator as child processes on the shared
testbed, SIGKILLed at each reconcile step and at random moments, then audited.

No apiserver restart here: the shared testbed serves other sessions. `make chaos` does it on a
private one.
"""

from __future__ import annotations

import pathlib
from typing import Any

from campaigns import chaos


def test_operator_killed_at_each_step_and_at_random_leaves_one_job_per_trainingjob(
        testbed: Any, api_client: Any, kubectl: Any, namespace: str,
        tmp_path: pathlib.Path) -> None:
    chaos.h.install_crd(kubectl)
    settings = chaos.Settings(jobs=8, operator_kills=2, estimator_kills=1, apiserver_restarts=0,
                              seed=7, quiesce_timeout_s=400.0)
    campaign = chaos.Campaign(settings, api_client, testbed.kubeconfig, namespace, tmp_path)
    report = campaign.run()
    print(report.table())
    assert report.step_kills == ["after-plan-status: refused", "after-annotations: refused",
                                 "after-job-create: allowed"], report.table()
    assert report.operator_kills == 2 and len(report.estimator_kills) == 1
    assert report.created == 8 + 3
    assert report.audit.duplicates == 0, report.table()
    assert report.audit.stuck == [], report.table()
    assert report.audit.mismatches == [], report.table()
    assert report.audit.trainingjobs == report.created, report.table()
    assert report.ok, report.table()


def _tj(status: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "a", "uid": "u1", "annotations": annotations or {}},
            "status": status}


PLAN = {"gpuType": "NVIDIA-L4", "gpuCount": 2}
PLANNED = {"type": "Estimated", "status": "True", "reason": "Planned"}
ANNOTATED = {"gpuplan.io/gpu-type": "NVIDIA-L4", "gpuplan.io/gpu-count": "2"}


def _job(name: str, complete: bool) -> dict[str, Any]:
    conditions = [{"type": "Complete", "status": "True"}] if complete else []
    return {"metadata": {"name": name, "annotations": ANNOTATED},
            "status": {"conditions": conditions}}


def test_audit_names_what_a_crash_can_leave_behind() -> None:
    """The audit's own checks (no cluster): each crash remnant is a mismatch, a sound one none."""
    launched = {"conditions": [PLANNED, {"type": "Launched", "status": "True"},
                               {"type": "Succeeded", "status": "True"}],
                "plan": PLAN, "jobName": "a-train"}
    assert chaos.classify(_tj(launched)) == "succeeded"
    assert chaos._mismatches(_tj(launched, ANNOTATED), "succeeded", [_job("a-train", True)]) == []
    # Plan status written, annotations not (the pre-fix crash window).
    assert any("annotation gpuplan.io/gpu-type=None" in m for m in chaos._mismatches(
        _tj(launched), "succeeded", [_job("a-train", True)]))
    # Job created, Launched never written.
    planned = {"conditions": [PLANNED], "plan": PLAN}
    assert chaos.classify(_tj(planned)) == "pending"
    assert any("status.jobName is unset" in m for m in chaos._mismatches(
        _tj(planned, ANNOTATED), "pending", [_job("a-train", False)]))
    # Launched names another Job; a finished Job whose outcome was never recorded.
    running = dict(launched, conditions=launched["conditions"][:2])
    found = chaos._mismatches(_tj(running, ANNOTATED), "launched", [_job("b-train", True)])
    assert any("but its Job is b-train" in m for m in found)
    assert any("is Complete but the TrainingJob is launched" in m for m in found)
    # A temporary refusal is not terminal.
    waiting = {"conditions": [{"type": "Estimated", "status": "False",
                               "reason": "EstimatorUnavailable"}]}
    assert chaos.classify(_tj(waiting)) == "Estimated=False:EstimatorUnavailable"
