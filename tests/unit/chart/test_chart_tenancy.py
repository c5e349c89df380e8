"""Issue #33 in the chart: storage that keeps data, honest probes, metrics on their own port,
bounded operator concurrency."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest
import yaml

from gpuplan_testing.helm_render import CHART, helm, render

from .test_notes import render as render_notes


def objects(*sets: str) -> list[dict[str, Any]]:
    out = render(*sets)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def estimator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deploy = one(docs, "Deployment", "t-gpuplan-estimator")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return container


def test_a_pvc_gets_recreate_and_survives_uninstall() -> None:
    docs = objects("estimator.persistence.enabled=true")
    assert one(docs, "Deployment", "t-gpuplan-estimator")["spec"]["strategy"] == {
        "type": "Recreate"}
    pvc = one(docs, "PersistentVolumeClaim", "t-gpuplan-estimator")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert "--ephemeral-data" not in estimator_container(docs)["args"]


def test_the_default_emptydir_is_announced_to_the_estimator() -> None:
    docs = objects()
    assert "strategy" not in one(docs, "Deployment", "t-gpuplan-estimator")["spec"]
    assert "--ephemeral-data" in estimator_container(docs)["args"]


@pytest.mark.parametrize(("sets", "words"), [
    (("estimator.persistence.enabled=true", "estimator.database.urlSecret=db"), "urlSecret"),
    (("estimator.persistence.enabled=true", "estimator.replicas=3",
      "estimator.database.urlSecret="), "replicas"),
])
def test_storage_that_would_lose_or_stall_is_refused(sets: tuple[str, ...], words: str) -> None:
    out = render(*sets)
    assert out.returncode != 0 and words in out.stderr, out.stderr


def test_notes_warn_only_when_data_is_on_an_emptydir(tmp_path: pathlib.Path) -> None:
    warning = "lost at every restart"
    assert warning in " ".join(render_notes(tmp_path / "a")[0].split())
    assert warning not in " ".join(
        render_notes(tmp_path / "b", "estimator.persistence.enabled=true")[0].split())
    assert warning not in " ".join(
        render_notes(tmp_path / "c", "estimator.database.urlSecret=db")[0].split())


def test_probes_and_a_metrics_port_of_its_own() -> None:
    docs = objects("metrics.serviceMonitor.enabled=true", "networkPolicy.enabled=true")
    container = estimator_container(docs)
    assert container["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert container["startupProbe"]["failureThreshold"] * \
        container["startupProbe"]["periodSeconds"] == 300
    args = container["args"]
    assert args[args.index("--metrics-port") + 1] == "9102"
    ports = {p["name"] for p in one(docs, "Service", "t-gpuplan-estimator")["spec"]["ports"]}
    assert ports == {"http", "metrics"}
    monitor = one(docs, "ServiceMonitor", "t-gpuplan")
    # The estimator's metrics port, and kube-scheduler's own (#32), never the estimator's API.
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics", "https-metrics"]
    policy = one(docs, "NetworkPolicy", "t-gpuplan-estimator")
    rules = {r["ports"][0]["port"]: r["from"] for r in policy["spec"]["ingress"]}
    assert set(rules) == {"http", "metrics"}
    assert len(rules["metrics"]) < len(rules["http"])  # Prometheus only, not the operator


def test_the_operator_gets_its_fetch_limits_and_kopfs_worker_limit() -> None:
    docs = objects()
    deploy = one(docs, "Deployment", "t-gpuplan-operator")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["GPUPLAN_MODEL_FETCHES"], env["GPUPLAN_MODEL_FETCHES_PER_NAMESPACE"],
            env["GPUPLAN_WORKER_LIMIT"]) == ("2", "4", "64")


def test_the_namespace_share_of_the_calibration_reaches_the_estimator() -> None:
    args = estimator_container(objects())["args"]
    assert args[args.index("--max-namespace-share") + 1] == "0.34"
    args = estimator_container(objects("estimator.maxNamespaceShare=1"))["args"]
    assert args[args.index("--max-namespace-share") + 1] == "1"


@pytest.mark.parametrize(("share", "problem"), [
    ("0", "exclusiveMinimum"), ("1.5", "maximum"), ("-0.1", "exclusiveMinimum"),
    ('"0.5"', "want number")])
def test_a_namespace_share_outside_0_to_1_is_refused(share: str, problem: str) -> None:
    out = subprocess.run([helm(), "template", "t", str(CHART), "--set-json",
                          f"estimator.maxNamespaceShare={share}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "maxNamespaceShare" in out.stderr and problem in out.stderr, out.stderr
