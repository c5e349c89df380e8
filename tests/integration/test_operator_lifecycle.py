"""Operator on the real control plane: plan → annotate → launch → kwok completes → drift."""

from __future__ import annotations

import urllib.request
from typing import Any

import pytest

from gpuplan_operator.core import resources
from gpuplan_testing import operator_harness as h
from gpuplan_testing import testbed_extender
from gpuplan_testing.estimator_server import EstimatorServer

pytestmark = pytest.mark.slow


def test_resnet50_is_planned_launched_and_measured(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, kubectl: Any, estimator: EstimatorServer, wait_for: Any,
        testbed: Any, gpuplan_scheduling: str) -> None:
    h.create_model_configmap(core_v1, namespace)
    port = h.free_port()
    filtered_before = testbed_extender.filter_calls(gpuplan_scheduling)

    def scrape() -> str:
        return str(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                          timeout=10).read().decode())

    with h.run_operator(monkeypatch, namespace, estimator.url, METRICS_PORT=str(port)):
        tjs.create(h.trainingjob("resnet", gpu_types=["NVIDIA-L4"]))
        done = wait_for(lambda: tjs.condition("resnet", "Succeeded"), 90, "Succeeded condition")
        text = scrape()
        tj = tjs.get("resnet")
        [job] = h.jobs_of(batch_v1, namespace, "resnet")
        pods = core_v1.list_namespaced_pod(namespace,
                                           label_selector="gpuplan.io/trainingjob=resnet",
                                           _request_timeout=30).items
        table = kubectl("get", "tj", "-n", namespace).stdout
        wide = kubectl("get", "tj", "-n", namespace, "-o", "wide").stdout
        # Deleting the TrainingJob drops its per-job gauges and garbage-collects its Job.
        tjs.delete("resnet")
        wait_for(lambda: 'trainingjob="resnet"' not in scrape(), 30, "per-job gauges dropped")
        wait_for(lambda: not h.jobs_of(batch_v1, namespace, "resnet"), 60,
                 "Job garbage collected")
    plan, status = tj["status"]["plan"], tj["status"]
    assert (plan["gpuType"], plan["gpuCount"]) == ("NVIDIA-L4", 1)
    assert plan["predictor"].startswith(("bundle:", "roofline")), plan["predictor"]
    notes = tj["metadata"]["annotations"]
    assert notes["gpuplan.io/gpu-type"] == "NVIDIA-L4" and notes["gpuplan.io/gpu-count"] == "1"
    assert float(notes["gpuplan.io/estimated-seconds"]) == pytest.approx(plan["estimatedSeconds"],
                                                                         abs=1)
    assert done["reason"] == "JobCompleted" and done["observedGeneration"] == 1
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    assert conditions["Estimated"] == conditions["Launched"] == "True"
    assert job.metadata.name == status["jobName"] == "resnet-train"
    # The API server took the failure policy: disruptions retried, trainer errors fatal.
    assert job.spec.backoff_limit == 3
    rules = job.spec.pod_failure_policy.rules
    assert [r.action for r in rules] == ["Ignore", "FailJob"]
    assert rules[1].on_exit_codes.container_name == "trainer"
    assert job.spec.template.spec.restart_policy == "Never"
    assert job.metadata.owner_references[0].uid == tj["metadata"]["uid"]
    container = job.spec.template.spec.containers[0]
    assert container.resources.limits == {"nvidia.com/gpu": "1"}
    expr = job.spec.template.spec.affinity.node_affinity.required_during_scheduling_ignored_during_execution.node_selector_terms[0].match_expressions[0]  # noqa: E501
    assert (expr.key, expr.values) == ("nvidia.com/gpu.product", ["NVIDIA-L4"])
    assert pods and all(p.spec.node_name.startswith("l4") for p in pods)
    # Placed by gpuplan-scheduler, which asked the extender (issue #16), not default-scheduler.
    assert all(p.spec.scheduler_name == testbed.gpuplan_scheduler_name for p in pods)
    assert testbed_extender.filter_calls(gpuplan_scheduling) >= filtered_before + len(pods)
    assert status["actual"]["seconds"] >= 1
    # Measured from the first container start, not from the Job's (earlier) start.
    assert status["actual"]["startTime"] >= status_start(job)
    assert "from the first container start" in done["message"]
    assert status["drift"] == pytest.approx(status["actual"]["seconds"] / plan["estimatedSeconds"],
                                            rel=1e-3)
    assert estimator.requests[0]["inventory"], "the inventory comes from the kwok GPU nodes"
    fed_back = estimator.outcomes()
    assert list(fed_back["job_uid"]) == [tj["metadata"]["uid"]]
    assert list(fed_back["device"]) == ["l4"]
    # A fresh database has no outcomes: the plan is uncalibrated, so the stored drift (against
    # the model's own estimate) is the status drift.
    assert plan["calibrationFactor"] == 1.0
    assert float(fed_back["drift_ratio"].iloc[0]) == pytest.approx(status["drift"], rel=1e-3)
    drift_labels = f'gpu_type="NVIDIA-L4",trainingjob_namespace="{namespace}"'
    assert f"gpuplan_drift_ratio_count{{{drift_labels}}} 1.0" in text
    assert f"gpuplan_drift_log_slow_total{{{drift_labels}}}" in text
    assert 'gpuplan_estimator_requests_total{outcome="ok"} 1.0' in text
    assert "gpuplan_actual_seconds{" in text and "gpuplan_estimate_seconds{" in text
    assert "GPU TYPE" in table and "NVIDIA-L4" in table and "DRIFT" in table
    # How the plan runs survives the API server's pruning and reaches the trainer (issue #19).
    layout, strategy = plan["parallelism"], plan["memoryStrategy"]
    assert layout["dp"] * layout["tp"] * layout["pp"] == plan["gpuCount"]
    assert "STRATEGY" in wide and "STRATEGY" not in table and strategy["label"] in wide
    # What the estimate rests on survives pruning too, and shows in the wide table (#18).
    assert plan["dataBasis"] in resources.DATA_BASES
    assert "BASIS" in wide and "BASIS" not in table and plan["dataBasis"] in wide
    env = {e.name: e.value for e in container.env}
    assert env["GPUPLAN_DATA_PARALLEL"] == str(layout["dp"])
    assert env["GPUPLAN_MEMORY_STRATEGY"] == strategy["label"]
    events = core_v1.list_namespaced_event(namespace, _request_timeout=30).items
    assert {"Planned", "JobCreated", "JobCompleted"} <= {e.reason for e in events}
    scheduled = [e for e in events if e.reason == "Scheduled"
                 and e.involved_object.name in {p.metadata.name for p in pods}]
    assert scheduled and all(
        (e.reporting_component or e.source.component) == testbed.gpuplan_scheduler_name
        for e in scheduled)


def status_start(job: Any) -> str:
    return str(job.status.start_time.strftime("%Y-%m-%dT%H:%M:%SZ"))


def test_more_gpus_than_a_node_runs_an_indexed_job(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any, testbed: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(h.trainingjob("wide", prefer="fastest", max_gpus=16,
                                 gpu_types=["NVIDIA-A100-SXM4-80GB"]))
        wait_for(lambda: tjs.condition("wide", "Succeeded"), 90, "multi-node job to succeed")
    plan = tjs.get("wide")["status"]["plan"]
    assert (plan["gpuCount"], plan["gpusPerNode"], plan["nodes"]) == (16, 8, 2)
    [job] = h.jobs_of(batch_v1, namespace, "wide")
    assert (job.spec.completion_mode, job.spec.completions, job.spec.parallelism) == (
        "Indexed", 2, 2)
    svc = core_v1.read_namespaced_service("wide-train", namespace, _request_timeout=30)
    assert svc.spec.cluster_ip == "None"
    env = {e.name: e for e in job.spec.template.spec.containers[0].env}
    assert env["MASTER_ADDR"].value == f"wide-train-0.wide-train.{namespace}.svc"
    assert env["WORLD_SIZE"].value == "16" and env["NPROC_PER_NODE"].value == "8"
    pods = core_v1.list_namespaced_pod(namespace, label_selector="gpuplan.io/trainingjob=wide",
                                       _request_timeout=30).items
    assert len({p.spec.node_name for p in pods}) == 2
    assert {p.spec.scheduler_name for p in pods} == {testbed.gpuplan_scheduler_name}


def test_restart_mid_way_neither_duplicates_nor_loses_state(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(h.trainingjob("restart", succeed_after="20s"))
        wait_for(lambda: tjs.get("restart").get("status", {}).get("plan"), 60, "plan in status")
    # Killed right after planning: the Job may or may not exist yet. (A plan request that
    # timed out on a loaded machine is retried before the plan lands; what must not happen is
    # a request once the plan is stored.)
    first = tjs.get("restart")["status"]
    planned_with = len(estimator.requests)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        wait_for(lambda: tjs.condition("restart", "Launched"), 60, "Launched after restart")
        [job] = h.jobs_of(batch_v1, namespace, "restart")
    with h.run_operator(monkeypatch, namespace, estimator.url):
        wait_for(lambda: tjs.condition("restart", "Succeeded"), 90, "Succeeded after restarts")
    assert len(estimator.requests) == planned_with, "the stored plan is reused, not re-estimated"
    [again] = h.jobs_of(batch_v1, namespace, "restart")
    assert again.metadata.uid == job.metadata.uid
    status = tjs.get("restart")["status"]
    assert status["plan"] == first["plan"]
    assert status["actual"]["seconds"] >= 1


def test_spec_change_after_launch_is_recorded_not_disruptive(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(h.trainingjob("change", succeed_after="30s"))
        wait_for(lambda: tjs.condition("change", "Launched"), 60, "Launched")
        [job] = h.jobs_of(batch_v1, namespace, "change")
        planned_with = len(estimator.requests)  # a timed-out request may have been retried
        tjs.patch_spec("change", {"training": {"epochs": 5}})
        cond = wait_for(lambda: tjs.condition("change", "SpecChangedAfterLaunch"), 60,
                        "spec change recorded")
    assert cond["reason"] == "SpecChangeIgnored" and cond["observedGeneration"] == 2
    [same] = h.jobs_of(batch_v1, namespace, "change")
    assert same.metadata.uid == job.metadata.uid
    assert tjs.get("change")["status"]["plan"]["observedGeneration"] == 1
    assert len(estimator.requests) == planned_with, "a spec change after launch re-planned"


def test_trainer_error_fails_fast_and_an_eviction_is_retried(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any) -> None:
    """podFailurePolicy on the real Job controller: exit code 1 fails the Job at its first pod
    (no drift, no outcome), an evicted pod is replaced without using up backoffLimit."""
    from kubernetes import client

    h.create_model_configmap(core_v1, namespace)
    crash = h.trainingjob("crash")
    crash["spec"]["template"]["metadata"]["annotations"] = {"testbed.io/fail-after": "2s"}

    def pods(tj: str) -> list[Any]:
        return list(core_v1.list_namespaced_pod(
            namespace, label_selector=f"gpuplan.io/trainingjob={tj}", _request_timeout=30).items)

    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(crash)
        tjs.create(h.trainingjob("evicted", succeed_after="20s"))
        running = wait_for(lambda: [p for p in pods("evicted") if p.status.phase == "Running"],
                           60, "evicted's pod running")
        core_v1.create_namespaced_pod_eviction(
            running[0].metadata.name, namespace, client.V1Eviction(
                metadata=client.V1ObjectMeta(name=running[0].metadata.name,
                                             namespace=namespace)), _request_timeout=30)
        failed = wait_for(lambda: tjs.condition("crash", "Failed"), 60, "crash fails")
        wait_for(lambda: tjs.condition("evicted", "Succeeded"), 90, "evicted pod replaced")
    [crash_job] = h.jobs_of(batch_v1, namespace, "crash")
    reasons = {c.type: c.reason for c in crash_job.status.conditions if c.status == "True"}
    assert reasons.get("Failed") == "PodFailurePolicy", reasons
    assert len(pods("crash")) == 1, "no retry of a trainer's own error"
    assert failed["reason"] == "JobFailed"
    assert "drift" not in tjs.get("crash")["status"]
    uids = list(estimator.outcomes()["job_uid"])
    # The evicted run succeeded on its second pod: not one uninterrupted attempt, so it is
    # labelled and kept out of calibration (issue #33), like the trainer's own error.
    assert uids == [], "outcomes of uninterrupted successes only"
    assert "drift" not in tjs.get("evicted")["status"]
    [evicted_job] = h.jobs_of(batch_v1, namespace, "evicted")
    assert not evicted_job.status.failed, "the eviction did not count toward backoffLimit"
    assert len(pods("evicted")) >= 1
