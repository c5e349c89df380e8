"""Operator failure paths on the real control plane, plus CRD schema/CEL and the examples."""

from __future__ import annotations

import base64
import pathlib
from collections.abc import Iterator
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


@pytest.fixture
def model_http_url(tmp_path: pathlib.Path) -> Iterator[str]:
    import functools
    import http.server
    import threading

    (tmp_path / "resnet50.onnx").write_bytes(h.RESNET50.read_bytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/resnet50.onnx"
    server.shutdown()
    server.server_close()


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
