"""Integration tests: everything under tests/integration is marked `integration` automatically.

The cluster fixtures (`testbed`, `namespace`, `kubectl`, `api_client`, `core_v1`, `batch_v1`,
`wait_for`) come from tests/conftest.py; see docs/testbed.md. The operator tests' `estimator`
(the real estimator service on a free port) and `tjs` (TrainingJob client, CRD installed) are here;
`tjs` also routes launched pods through gpuplan-scheduler and its extender (`gpuplan_scheduling`).
"""

from __future__ import annotations

import pathlib
from collections.abc import Iterator
from typing import Any

import pytest

from gpuplan_testing import operator_harness as h
from gpuplan_testing import testbed_extender
from gpuplan_testing.estimator_server import EstimatorServer

HERE = pathlib.Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # This hook sees the whole session's items, so restrict it to this directory.
    for item in items:
        if HERE in pathlib.Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def estimator() -> Iterator[EstimatorServer]:
    est = EstimatorServer().start()
    yield est
    est.stop()


@pytest.fixture
def gpuplan_scheduling(testbed: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Launched pods go to the testbed's gpuplan-scheduler (GPUPLAN_SCHEDULER_NAME), which calls
    the extender served here (issue #16); yields the extender's base URL."""
    monkeypatch.setenv("GPUPLAN_SCHEDULER_NAME", testbed.gpuplan_scheduler_name)
    # every test namespace, not only those labelled gpuplan.io/scheduler=enabled (issue #32)
    monkeypatch.setenv("GPUPLAN_SCHEDULER_SCOPE", "all")
    with testbed_extender.serving(testbed) as url:
        yield url


@pytest.fixture
def tjs(testbed: Any, kubectl: Any, api_client: Any, namespace: str,
        gpuplan_scheduling: str) -> h.TrainingJobs:
    h.install_crd(kubectl)
    return h.TrainingJobs(api_client, namespace)
