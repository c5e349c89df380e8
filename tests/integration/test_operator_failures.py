"""Operator failure paths on the real control plane, plus CRD schema/CEL and the examples."""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import pathlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuplan_estimator.graph import examples
from gpuplan_testing import operator_harness as h
from gpuplan_testing.estimator_server import EstimatorServer

EXAMPLES = sorted((h.ROOT / "docs" / "examples").glob("*.yaml"))


@pytest.mark.slow
def test_bad_model_is_invalid_model_and_launches_nothing(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any) -> None:
    h.create_model_configmap(core_v1, namespace, name="junk", data=b"\x08\x01not an onnx graph")
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(h.trainingjob("bad", config_map="junk"))
        cond = wait_for(lambda: tjs.condition("bad", "Estimated"), 60, "Estimated condition")
    assert (cond["status"], cond["reason"]) == ("False", "InvalidModel")
    assert not h.jobs_of(batch_v1, namespace, "bad")
    assert core_v1.read_namespaced_config_map("junk", namespace, _request_timeout=30)
    assert tjs.get("bad")["metadata"]["name"] == "bad", "nothing deleted"


@pytest.mark.slow
def test_no_feasible_plan_names_a_reason_per_gpu_type(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(h.trainingjob("tight", deadline="1s", max_gpus=1))
        cond = wait_for(lambda: tjs.condition("tight", "Estimated"), 60, "Estimated condition")
    assert (cond["status"], cond["reason"]) == ("False", "NoFeasiblePlan")
    for gpu in ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"):
        assert gpu in cond["message"]
    assert not h.jobs_of(batch_v1, namespace, "tight")


@pytest.mark.slow
def test_estimator_down_retries_then_recovers_and_replans_spec_changes(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, wait_for: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    port = h.free_port()
    with h.run_operator(monkeypatch, namespace, f"http://127.0.0.1:{port}"):
        tjs.create(h.trainingjob("later"))
        cond = wait_for(lambda: tjs.condition("later", "Estimated"), 60, "Estimated condition")
        assert (cond["status"], cond["reason"]) == ("False", "EstimatorUnavailable")
        assert not h.jobs_of(batch_v1, namespace, "later")
        tjs.patch_spec("later", {"training": {"epochs": 2}})  # before launch: re-planned
        est = EstimatorServer(port).start()
        try:
            wait_for(lambda: tjs.condition("later", "Launched"), 60, "launch after recovery")
        finally:
            est.stop()
    status = tjs.get("later")["status"]
    assert status["plan"]["observedGeneration"] == 2
    assert est.requests[-1]["training"]["epochs"] == 2
    assert h.TrainingJobs.condition(tjs, "later", "Estimated")["reason"] == "Planned"  # type: ignore[index]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_examples_apply_server_side(example: pathlib.Path, tjs: h.TrainingJobs, kubectl: Any,
                                   namespace: str) -> None:
    kubectl("apply", "--server-side", "-n", namespace, "-f", str(example))
    name = kubectl("get", "-n", namespace, "-f", str(example), "-o", "name").stdout.strip()
    assert name.startswith("trainingjob.gpuplan.io/")


@pytest.mark.parametrize(("patch", "message"), [
    ({"model": {"onnx": {"configMapKeyRef": {"name": "a", "key": "b"}, "url": "https://x/y"}}},
     "exactly one of model.onnx.configMapKeyRef and model.onnx.url"),
    ({"model": {"onnx": {"url": "https://x/y"},
                "hfConfig": {"configMapKeyRef": {"name": "a", "key": "b"}}}},
     "exactly one of model.onnx and model.hfConfig"),
    ({"objective": {"deadline": "4 hours"}}, "objective.deadline must be a duration"),
    ({"objective": {"budget": 0}}, "objective.budget must be greater than 0"),
    ({"objective": {"maxGpus": 0}}, "spec.objective.maxGpus"),
    ({"model": {"onnx": {"url": "file:///etc/passwd"}}}, "http:// or https://"),
    ({"training": {"optimizer": "lbfgs"}}, "spec.training.optimizer"),
    ({"training": {"optimizer": "rmsprop", "optimizerImpl": "fused"}},
     "optimizerImpl fused is not available for rmsprop"),
])
def test_crd_rejects_bad_specs(patch: dict[str, Any], message: str, tjs: h.TrainingJobs) -> None:
    from kubernetes.client.exceptions import ApiException

    body = h.trainingjob("bad")
    for key, value in patch.items():
        body["spec"][key] = {**body["spec"][key], **value} if key != "model" else value
    with pytest.raises(ApiException) as info:
        tjs.create(body)
    assert info.value.status == 422
    assert message in str(info.value.body)


@contextlib.contextmanager
def _loopback_http_server(handler: Callable[..., http.server.BaseHTTPRequestHandler],
                          ) -> Iterator[int]:
    """Serves `handler` on 127.0.0.1 from a thread until the block ends; yields the port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def model_http_url(tmp_path: pathlib.Path) -> Iterator[str]:
    (tmp_path / "resnet50.onnx").write_bytes(h.RESNET50.read_bytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with _loopback_http_server(handler) as port:
        yield f"http://127.0.0.1:{port}/resnet50.onnx"


@pytest.mark.slow
def test_model_url_guard_blocks_loopback_unless_allowed(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs,
        estimator: EstimatorServer, model_http_url: str, wait_for: Any) -> None:
    def by_url(name: str) -> dict[str, Any]:
        body = h.trainingjob(name)
        body["spec"]["model"] = {"onnx": {"url": model_http_url}}
        return body

    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(by_url("blocked"))
        cond = wait_for(lambda: tjs.condition("blocked", "Estimated"), 60, "Estimated condition")
    assert (cond["status"], cond["reason"]) == ("False", "InvalidModel")
    assert "loopback address refused" in cond["message"]
    assert not estimator.requests
    with h.run_operator(monkeypatch, namespace, estimator.url,
                        MODEL_URL_ALLOWED_NETWORKS="127.0.0.1/32"):
        tjs.create(by_url("allowed"))
        wait_for(lambda: tjs.condition("allowed", "Launched"), 60, "launch from a URL model")
    sent = estimator.requests[-1]["model_onnx_b64"]
    assert sent == base64.b64encode(h.RESNET50.read_bytes()).decode()


@pytest.mark.slow
def test_a_hf_config_in_a_configmap_is_planned_and_launched(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        estimator: EstimatorServer, wait_for: Any) -> None:
    """spec.model.hfConfig: the operator sends the config.json and the estimator builds the
    graph (GPT-2 medium, without torch)."""
    core_v1.create_namespaced_config_map(namespace, {
        "metadata": {"name": "gpt2-config"},
        "data": {"config.json": examples.GPT2_CONFIG.read_text()}}, _request_timeout=30)
    body = h.trainingjob("from-config")
    body["spec"]["model"] = {"hfConfig": {"configMapKeyRef": {"name": "gpt2-config",
                                                              "key": "config.json"}}}
    body["spec"]["training"] = {"batchSize": 64, "datasetSize": 6400, "epochs": 1,
                                "sequenceLength": 128}
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(body)
        wait_for(lambda: tjs.condition("from-config", "Launched"), 90, "launch from a HF config")
    sent = estimator.requests[-1]
    assert sent["model_hf_config"]["model_type"] == "gpt2" and "model_onnx_b64" not in sent
    assert sent["training"]["dims"] == {"sequence": 128}


@pytest.fixture
def h200_node(core_v1: Any, namespace: str) -> Iterator[Callable[[], None]]:
    """Adds one kwok node with 8 NVIDIA-H200 (a GPU type the testbed lacks) when called.

    Tainted for this test's namespace, so other sessions sharing the testbed never schedule
    onto it; removed afterwards.
    """
    pool = {"namePrefix": f"h200-{namespace[-6:]}", "count": 1, "cpu": "96", "memory": "1000Gi",
            "gpu": {"product": "NVIDIA-H200", "count": 8, "memoryMiB": 143771}}
    with h.tainted_gpu_node(core_v1, namespace, pool) as add:
        yield add


@pytest.mark.slow
def test_no_feasible_plan_is_replanned_when_gpu_nodes_are_added(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any,
        h200_node: Callable[[], None]) -> None:
    h.create_model_configmap(core_v1, namespace)
    body = h.trainingjob("waits", gpu_types=["NVIDIA-H200"])
    body["spec"]["template"]["spec"]["tolerations"] = [
        {"key": "gpuplan.io/test", "operator": "Equal", "value": namespace,
         "effect": "NoSchedule"}]
    with h.run_operator(monkeypatch, namespace, estimator.url,
                        CAPACITY_CHECK_INTERVAL_SECONDS="1"):
        tjs.create(body)
        cond = wait_for(lambda: tjs.condition("waits", "Estimated"), 60, "Estimated condition")
        assert (cond["status"], cond["reason"]) == ("False", "NoFeasiblePlan")
        asked = len(estimator.requests)
        h200_node()
        wait_for(lambda: tjs.condition("waits", "Succeeded"), 90, "re-planned, launched, done")
    assert asked == 1, "unchanged capacity is not re-estimated"
    plan = tjs.get("waits")["status"]["plan"]
    assert plan["gpuType"] == "NVIDIA-H200"
    assert any(p["gpu_type"] == "NVIDIA-H200" for p in estimator.requests[-1]["inventory"])
    assert len(h.jobs_of(batch_v1, namespace, "waits")) == 1
    pods = core_v1.list_namespaced_pod(namespace, label_selector="gpuplan.io/trainingjob=waits",
                                       _request_timeout=30).items
    assert {p.spec.node_name for p in pods} == {f"h200-{namespace[-6:]}-0"}


def _events(core_v1: Any, namespace: str, reason: str) -> int:
    items = core_v1.list_namespaced_event(namespace, _request_timeout=30).items
    return sum(e.count or 1 for e in items if e.reason == reason)


@pytest.mark.slow
def test_rejected_job_and_missing_service_account_set_launch_conditions(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, estimator: EstimatorServer, wait_for: Any) -> None:
    h.create_model_configmap(core_v1, namespace)
    invalid = h.trainingjob("invalid")
    invalid["spec"]["template"]["spec"]["containers"][0]["name"] = "Trainer_1"  # not a DNS label
    needs_sa = h.trainingjob("needs-sa")
    needs_sa["spec"]["template"]["spec"]["serviceAccountName"] = "trainer"
    with h.run_operator(monkeypatch, namespace, estimator.url):
        tjs.create(invalid)
        tjs.create(needs_sa)
        rejected = wait_for(lambda: tjs.condition("invalid", "Launched"), 60, "JobRejected")
        missing = wait_for(lambda: tjs.condition("needs-sa", "Launched"), 60, "no account")
        assert (missing["status"], missing["reason"]) == ("False", "ServiceAccountNotFound")
        assert "'trainer'" in missing["message"]
        assert not h.jobs_of(batch_v1, namespace, "needs-sa")
        core_v1.create_namespaced_service_account(namespace, {"metadata": {"name": "trainer"}},
                                                  _request_timeout=30)
        wait_for(lambda: (tjs.condition("needs-sa", "Launched") or {}).get("status") == "True",
                 60, "launch once the account exists")
        # The operator keeps retrying needs-sa (1-2 s backoff) meanwhile; a rejected Job is
        # not retried: still exactly one rejection.
        assert _events(core_v1, namespace, "JobRejected") == 1
    assert (rejected["status"], rejected["reason"]) == ("False", "JobRejected")
    assert "422" in rejected["message"] and "Trainer_1" in rejected["message"]
    assert not h.jobs_of(batch_v1, namespace, "invalid")
    [job] = h.jobs_of(batch_v1, namespace, "needs-sa")
    assert job.spec.template.spec.service_account_name == "trainer"


@pytest.fixture
def broken_model_server() -> Iterator[int]:
    """A loopback HTTP server whose model is declared gzip-encoded but is not."""
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"\x1f\x8b\x08\x00" + b"\xff" * 64
            self.send_response(200)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: Any) -> None:
            pass

    with _loopback_http_server(Handler) as port:
        yield port


@pytest.mark.slow
def test_model_fetch_errors_end_in_a_condition(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs,
        estimator: EstimatorServer, broken_model_server: int, wait_for: Any) -> None:
    urls = {"short-ipv4": f"http://127.1:{broken_model_server}/m.onnx",
            "octal-ipv4": f"http://0177.0.0.1:{broken_model_server}/m.onnx",
            "bad-gzip": f"http://127.0.0.1:{broken_model_server}/m.onnx"}
    with h.run_operator(monkeypatch, namespace, estimator.url,
                        MODEL_URL_ALLOWED_NETWORKS="127.0.0.1/32"):
        for name, url in urls.items():
            body = h.trainingjob(name)
            body["spec"]["model"] = {"onnx": {"url": url}}
            tjs.create(body)
        conds = {name: wait_for(lambda n=name: tjs.condition(n, "Estimated"), 60, name)
                 for name in urls}
    for name, needle in (("short-ipv4", "not a canonical IPv4"),
                         ("octal-ipv4", "not a canonical IPv4"),
                         ("bad-gzip", "does not match its Content-Encoding")):
        assert (conds[name]["status"], conds[name]["reason"]) == ("False", "InvalidModel")
        assert needle in conds[name]["message"], conds[name]["message"]
    assert not estimator.requests


@pytest.mark.slow
def test_a_stored_plan_without_annotations_is_completed_not_re_estimated(
        monkeypatch: pytest.MonkeyPatch, namespace: str, tjs: h.TrainingJobs, core_v1: Any,
        batch_v1: Any, api_client: Any, estimator: EstimatorServer, wait_for: Any) -> None:
    """The state an operator killed between writing status.plan and the annotations leaves:
    the next one writes the annotations and launches from the stored plan."""
    from kubernetes import client

    h.create_model_configmap(core_v1, namespace)
    tjs.create(h.trainingjob("half-done"))
    plan = {"gpuType": "NVIDIA-L4", "device": "l4", "gpuCount": 1, "gpusPerNode": 1, "nodes": 1,
            "estimatedSeconds": 600.0, "stepTimeMs": 5.0, "memoryBytes": 2**30,
            "predictor": "roofline", "observedGeneration": 1, "calibrationFactor": 1.0,
            "alternatives": [], "rejected": []}
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status(
        h.G, h.V, namespace, h.P, "half-done", {"status": {
            "plan": plan, "observedGeneration": 1, "conditions": [{
                "type": "Estimated", "status": "True", "reason": "Planned", "message": "x",
                "observedGeneration": 1, "lastTransitionTime": "2026-01-01T00:00:00Z"}]}},
        _request_timeout=30)
    with h.run_operator(monkeypatch, namespace, estimator.url):
        wait_for(lambda: tjs.condition("half-done", "Launched"), 60, "launch from stored plan")
    tj = tjs.get("half-done")
    notes = tj["metadata"]["annotations"]
    assert (notes["gpuplan.io/gpu-type"], notes["gpuplan.io/gpu-count"],
            notes["gpuplan.io/estimated-seconds"]) == ("NVIDIA-L4", "1", "600")
    assert not estimator.requests, "the stored plan is used, not re-estimated"
    [job] = h.jobs_of(batch_v1, namespace, "half-done")
    assert job.metadata.annotations["gpuplan.io/gpu-type"] == "NVIDIA-L4"
