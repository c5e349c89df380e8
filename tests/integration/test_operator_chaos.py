"""A slice of the kill-safety campaign (`make chaos` runs the full one, docs in
`gpuplan_testing/chaos.py`): the real operator and estimator as child processes on the shared
testbed, SIGKILLed at each reconcile step and at random moments, then audited.

No apiserver restart here: the shared testbed serves other sessions. `make chaos` does it on a
private one.
"""

from __future__ import annotations

import pathlib
from typing import Any

from gpuplan_testing import chaos


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
