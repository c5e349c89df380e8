"""A GPU the shipped catalog lacks, described in a user catalog (#34), is planned by the real
estimator and its pods placed by gpuplan-scheduler on the kwok node carrying its product label."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import yaml

from gpuplan_testing import operator_harness as h
from gpuplan_testing.estimator_server import EstimatorServer

pytestmark = pytest.mark.slow

CATALOG = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "catalogs" / \
    "h100-96gb-hbm2e.yaml"
PRODUCT = yaml.safe_load(CATALOG.read_text())["devices"][0]["gfd_products"][0]


@pytest.fixture
def user_estimator() -> Iterator[EstimatorServer]:
    est = EstimatorServer(catalog_file=str(CATALOG)).start()
    yield est
    est.stop()


@pytest.fixture
def user_gpu_node(core_v1: Any, namespace: str) -> Iterator[Callable[[], None]]:
    """One kwok node of 4 of the user's GPU, tainted for this test's namespace."""
    pool = {"namePrefix": f"h96-{namespace[-6:]}", "count": 1, "cpu": "96", "memory": "1000Gi",
            "gpu": {"product": PRODUCT, "count": 4, "memoryMiB": 98304}}
    with h.tainted_gpu_node(core_v1, namespace, pool) as add:
        yield add


def test_a_user_catalog_gpu_is_planned_and_placed_on_its_node(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        user_estimator: EstimatorServer, wait_for: Any,
        user_gpu_node: Callable[[], None]) -> None:
    h.create_model_configmap(core_v1, namespace)
    user_gpu_node()
    body = h.trainingjob("mine", gpu_types=[PRODUCT])
    body["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "gpuplan.io/test", "operator": "Equal", "value": namespace,
         "effect": "NoSchedule"}]
    with h.run_operator(monkeypatch, namespace, user_estimator.url):
        tjs.create(body)
        wait_for(lambda: tjs.condition("mine", "Succeeded"), 90, "planned, launched, done")
    plan = tjs.get("mine")["status"]["plan"]
    assert plan["gpuType"] == PRODUCT
    assert any(p["gpu_type"] == PRODUCT for p in user_estimator.requests[-1]["inventory"])
    pods = core_v1.list_namespaced_pod(namespace, label_selector="gpuplan.io/trainingjob=mine",
                                       _request_timeout=30).items
    assert pods and {p.spec.node_name for p in pods} == {f"h96-{namespace[-6:]}-0"}


def test_without_the_catalog_the_label_is_not_planned(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        estimator: EstimatorServer, wait_for: Any, user_gpu_node: Callable[[], None]) -> None:
    h.create_model_configmap(core_v1, namespace)
    user_gpu_node()
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(h.trainingjob("shipped", gpu_types=[PRODUCT]))
        cond = wait_for(lambda: tjs.condition("shipped", "Estimated"), 60, "Estimated")
    # The shipped catalog does not know the label: the allow-list names an unknown GPU type.
    assert (cond["status"], cond["reason"]) == ("False", "InvalidRequest")
    assert PRODUCT in cond["message"]
