"""Issue #20: the service's typed API — strict request models, one error envelope, one batch
rule for plans and estimates, and an OpenAPI document that cannot drift from the code."""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import pathlib
import re
from collections.abc import Awaitable, Callable
from typing import Any

import onnx
import pytest
from aiohttp.test_utils import TestClient, TestServer
from pydantic import BaseModel

from gpuplan_estimator.core import limits
from gpuplan_estimator.interfaces.http import openapi, responses, service, wire
from gpuplan_testing import onnx_models
from gpuplan_testing.contexts import roofline_context

ROOT = pathlib.Path(__file__).parents[4]
LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RESNET50_B64 = base64.b64encode((LIGHT / "light_resnet50.onnx").read_bytes()).decode()
INVENTORY = [
    {"gpu_type": "NVIDIA-H100-80GB-HBM3", "gpus_per_node": 8, "nodes": 4, "free_gpus": 32},
    {"gpu_type": "NVIDIA-L4", "gpus_per_node": 4, "nodes": 8},
]
FOLDED_B64 = base64.b64encode(onnx_models.batch_folded_model().SerializeToString()).decode()
OUTCOME = {"job_uid": "u1", "gpu_type": "NVIDIA-L4", "gpu_count": 2,
           "estimated_seconds": 100.0, "actual_seconds": 130}


def plan_body(**overrides: Any) -> dict[str, Any]:
    return {"model_onnx_b64": RESNET50_B64,
            "training": {"batch_size": 1, "dataset_size": 10000, "optimizer": "sgd"},
            "objective": {"prefer": "cheapest", "max_gpus": 8}, "inventory": INVENTORY,
            **overrides}


def serve(check: Callable[[TestClient], Awaitable[None]]) -> None:
    """The real service with an outcome sink and a coverage source, over a socket."""
    def sink(req: wire.OutcomeRequest, device: str) -> tuple[int, bool]:
        return 7, req.job_uid != "again"

    def coverage() -> dict[str, tuple[int, dt.datetime | None]]:
        return {"l4": (3, dt.datetime(2026, 3, 1, tzinfo=dt.UTC))}

    async def main() -> None:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600, max_body_bytes=2**20),
                               outcome_sink=sink, coverage_source=coverage)
        async with TestClient(TestServer(app)) as client:
            await check(client)

    asyncio.run(main())


async def answer(client: TestClient, method: str, path: str, model: type[BaseModel],
                 status: int, **kwargs: Any) -> dict[str, Any]:
    """Call the service and validate its answer against the documented model."""
    resp = await client.request(method, path, **kwargs)
    assert resp.status == status, await resp.text()
    body: dict[str, Any] = await resp.json()
    model.model_validate(body)
    return body


def error(body: dict[str, Any]) -> dict[str, Any]:
    """The envelope's error, after checking the envelope against its model."""
    responses.ErrorEnvelope.model_validate(body)
    err: dict[str, Any] = body["error"]
    return err


def test_every_answer_of_the_running_service_matches_its_model() -> None:
    async def check(c: TestClient) -> None:
        plan = await answer(c, "POST", "/v1/plans", responses.PlanResponse, 200,
                            json=plan_body())
        assert plan["plan"]["gpu_type"] in {p["gpu_type"] for p in INVENTORY}
        estimate = {"model_onnx_b64": RESNET50_B64, "training": {"batch_size": 2},
                    "devices": ["t4"]}
        await answer(c, "POST", "/v1/estimate", responses.EstimateResponse, 200, json=estimate)
        await answer(c, "POST", "/v1/outcomes", responses.OutcomeResponse, 201, json=OUTCOME)
        dup = await answer(c, "POST", "/v1/outcomes", responses.OutcomeResponse, 200,
                           json={**OUTCOME, "job_uid": "again"})
        assert dup["duplicate"] is True
        await answer(c, "GET", "/v1/models", responses.ModelsResponse, 200)
        cov = await answer(c, "GET", "/v1/coverage", responses.CoverageResponse, 200)
        assert cov["devices"]["l4"]["measurements"] == 3
        await answer(c, "GET", "/healthz", responses.HealthResponse, 200)
        await answer(c, "GET", "/readyz", responses.ReadyResponse, 200)
        for method, path, body, status, reason in [
            ("POST", "/v1/plans", b"{not json", 400, "InvalidJSON"),
            ("POST", "/v1/estimate", b"\xff", 400, "InvalidJSON"),
            ("POST", "/v1/outcomes", b"[1,", 400, "InvalidJSON"),
            ("POST", "/v1/plans", b"[]", 422, "InvalidRequest"),
            ("POST", "/v1/plans", b"x" * (2**20 + 1), 413, "RequestTooLarge"),
            ("GET", "/v2/nothing", None, 404, "NotFound"),
            ("GET", "/v1/plans", None, 405, "MethodNotAllowed"),
            ("DELETE", "/openapi.json", None, 405, "MethodNotAllowed"),
        ]:
            got = await answer(c, method, path, responses.ErrorEnvelope, status, data=body)
            assert got["error"]["reason"] == reason, (path, got)
        infeasible = plan_body(objective={"max_gpus": 1, "deadline_seconds": 1e-6})
        got = await answer(c, "POST", "/v1/plans", responses.ErrorEnvelope, 422,
                           json=infeasible)
        assert got["error"]["reason"] == "NoFeasiblePlan"
        assert {d["gpu_type"] for d in got["error"]["details"]} == {p["gpu_type"]
                                                                     for p in INVENTORY}

    serve(check)


@pytest.mark.parametrize(("path", "body", "fields"), [
    # JSON types are strict: true is no integer, "8" no number, 2.0 no integer.
    ("/v1/plans", plan_body(training={"batch_size": True}), ["training.batch_size"]),
    ("/v1/plans", plan_body(training={"batch_size": 2.0}), ["training.batch_size"]),
    ("/v1/plans", plan_body(objective={"deadline_seconds": "3600"}),
     ["objective.deadline_seconds"]),
    ("/v1/plans", plan_body(inventory=[INVENTORY[0], {**INVENTORY[1], "nodes": "8"},
                                       {"gpu_type": "x", "gpus_per_node": 65}]),
     ["inventory[1].nodes", "inventory[2].gpus_per_node"]),
    ("/v1/plans", plan_body(training={"batch_size": 1, "optimizer": "lion", "mode": 3}),
     ["training.optimizer", "training.mode"]),
    ("/v1/plans", plan_body(training={"batch_size": 1, "attention": "flash"}),
     ["training.attention"]),
    ("/v1/plans", plan_body(gpu_types=["a", 7]), ["gpu_types[1]"]),
    ("/v1/plans", plan_body(model_onnx_b64="not base64!"), ["model_onnx_b64"]),
    ("/v1/plans", {**plan_body(), "training": "big"}, ["training"]),
    ("/v1/estimate", {"training": {"batch_size": 1}}, ["model_onnx_b64"]),
    ("/v1/estimate", {"model_onnx_b64": RESNET50_B64,
                      "training": {"batch_size": 1, "dims": {"x" * 129: 1}}},
     ["training.dims." + "x" * 129]),
    ("/v1/estimate", {"model_onnx_b64": RESNET50_B64, "training": {"batch_size": 1},
                      "devices": [None]}, ["devices[0]"]),
    ("/v1/outcomes", {**OUTCOME, "gpu_count": False, "estimated_seconds": float("nan")},
     ["gpu_count", "estimated_seconds"]),
    ("/v1/outcomes", {**OUTCOME, "job_uid": ""}, ["job_uid"]),
])
def test_invalid_fields_are_422_with_their_json_paths(path: str, body: Any,
                                                      fields: list[str]) -> None:
    async def check(c: TestClient) -> None:
        resp = await c.post(path, data=json.dumps(body),
                            headers={"Content-Type": "application/json"})
        assert resp.status == 422, await resp.text()
        err = error(await resp.json())
        assert err["reason"] == "InvalidRequest"
        assert [d["field"] for d in err["details"]] == fields

    serve(check)


def test_bounds_come_from_the_limits_module() -> None:
    """The models read core.limits: the cap itself passes, one past it is refused."""
    at_cap = wire.parse_plan_request(plan_body(training={"batch_size": limits.MAX_BATCH_SIZE}))
    assert at_cap.training.batch_size == limits.MAX_BATCH_SIZE
    assert at_cap.training.dataset_size == limits.MAX_BATCH_SIZE  # absent: one batch
    with pytest.raises(wire.InvalidFieldsError) as info:
        wire.parse_plan_request(plan_body(training={"batch_size": limits.MAX_BATCH_SIZE + 1}))
    assert info.value.problems == (
        ("training.batch_size", f"Input should be less than or equal to {limits.MAX_BATCH_SIZE}"),)
    schema = openapi.document()["components"]["schemas"]
    assert schema["TrainingBody"]["properties"]["batch_size"]["maximum"] == limits.MAX_BATCH_SIZE
    assert schema["PlanRequestBody"]["properties"]["inventory"]["maxItems"] == (
        wire.MAX_INVENTORY_POOLS)


def test_a_million_bad_dims_make_one_error() -> None:
    with pytest.raises(wire.InvalidFieldsError) as info:
        wire.parse_estimate_request({"model_onnx_b64": RESNET50_B64, "training": {
            "batch_size": 1, "dims": {str(i): "bad" for i in range(1_000_000)}}})
    assert info.value.problems == (("training.dims", "at most 64 dims, got 1000000"),)


def test_plans_and_estimates_apply_one_batch_rule() -> None:
    """A fixed-batch export is re-batched by both endpoints; one whose constants keep its
    batch is refused by both, naming training.batch_size (plans used to scale it per sample)."""
    async def check(c: TestClient) -> None:
        for model, status in ((RESNET50_B64, 200), (FOLDED_B64, 422)):
            training = {"batch_size": 2, "dataset_size": 100}
            plan = await c.post("/v1/plans", json=plan_body(
                model_onnx_b64=model, training=training, objective={"max_gpus": 1}))
            estimate = await c.post("/v1/estimate", json={
                "model_onnx_b64": model, "training": training, "devices": ["l4"]})
            assert (plan.status, estimate.status) == (status, status), await plan.text()
            if status == 200:
                assert (await plan.json())["plan"]["per_gpu_batch"] == 2
                assert (await estimate.json())["settings"]["batch_size"] == 2
                continue
            for resp in (plan, estimate):
                err = error(await resp.json())
                assert err["reason"] == "InvalidRequest"
                assert [d["field"] for d in err["details"]] == ["training.batch_size"]
                assert "fixed batch of 1" in err["details"][0]["message"]

    serve(check)


def test_the_committed_document_is_the_generated_one() -> None:
    committed = (ROOT / "docs" / "openapi.json").read_text()
    assert committed == openapi.render(), "docs/openapi.json is stale: run `make openapi`"


def test_every_route_is_documented_and_served() -> None:
    app = service.make_app(service.ServiceState(roofline_context))
    routes = {(r.method.lower(), r.resource.canonical) for r in app.router.routes()
              if r.resource is not None and r.method != "HEAD"}
    doc = openapi.document()
    documented = {(method, path) for path, ops in doc["paths"].items() for method in ops}
    assert routes == documented

    async def check(c: TestClient) -> None:
        resp = await c.get(openapi.DOCUMENT_PATH)
        assert resp.status == 200
        assert await resp.json() == doc

    serve(check)


def test_every_reference_resolves() -> None:
    text = openapi.render()
    refs = set(re.findall(r'"\$ref": "#/components/schemas/([A-Za-z]+)"', text))
    assert refs and refs <= set(openapi.document()["components"]["schemas"])
    assert "$defs" not in text


def test_the_documented_examples_are_valid_bodies() -> None:
    """Each example in docs/estimator-service.md follows a `<!-- model: Name -->` line and
    validates against that model of `wire` or `responses`."""
    doc = (ROOT / "docs" / "estimator-service.md").read_text()
    examples = re.findall(r"<!-- model: (\w+) -->\n```json\n(.*?)\n```", doc, re.DOTALL)
    names = [name for name, _ in examples]
    assert {"PlanRequestBody", "PlanResponse", "EstimateRequestBody", "OutcomeBody",
            "ErrorEnvelope"} <= set(names)
    for name, text in examples:
        model = getattr(wire, name, None) or getattr(responses, name)
        model.model_validate(json.loads(text))


def test_a_fused_attention_estimate_keeps_no_scores() -> None:
    """The same GPT-2 estimated with eager and with fused attention: the answer says which,
    and fused needs less activation memory and time (no [batch, heads, S, S] tensors)."""
    gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_head": 4, "n_layer": 2,
            "vocab_size": 1000, "n_positions": 512}

    async def check(c: TestClient) -> None:
        got = {}
        for attention in ("eager", "fused"):
            resp = await c.post("/v1/estimate", json={
                "model_hf_config": gpt2, "devices": ["l4"],
                "training": {"batch_size": 4, "attention": attention,
                             "dims": {"sequence": 512}}})
            assert resp.status == 200, await resp.text()
            got[attention] = await resp.json()
            responses.EstimateResponse.model_validate(got[attention])
            assert got[attention]["settings"]["attention"] == attention
            assert got[attention]["attention"] == {
                "requested": attention, "cores": 2,
                "fused_cores": 2 if attention == "fused" else 0, "unfused_scores": 0,
                "warning": None}
        (eager,), (fused,) = (got[a]["devices"] for a in ("eager", "fused"))
        scores = 2 * 4 * 4 * 512 * 512 * 4  # two layers' probabilities, fp32
        assert eager["memory"]["activations_bytes"] - fused["memory"]["activations_bytes"] > (
            scores / 2)
        assert fused["step_time_ms"] < eager["step_time_ms"]

    serve(check)


def test_fused_attention_on_a_graph_without_a_core_says_it_is_priced_eager() -> None:
    """ResNet-50 has no attention: asked fused, the estimate and the plan both answer that no
    core was found and the price is eager, in a field a client can read."""
    async def check(c: TestClient) -> None:
        body = await answer(c, "POST", "/v1/estimate", responses.EstimateResponse, 200, json={
            "model_onnx_b64": RESNET50_B64, "devices": ["l4"],
            "training": {"batch_size": 1, "attention": "fused"}})
        report = body["attention"]
        assert (report["requested"], report["cores"], report["fused_cores"]) == ("fused", 0, 0)
        assert "no attention core" in report["warning"] and "eager" in report["warning"]
        plan = await answer(c, "POST", "/v1/plans", responses.PlanResponse, 200,
                            json=plan_body(training={"batch_size": 1, "dataset_size": 100,
                                                     "attention": "fused"}))
        assert plan["attention"] == report
        eager = await answer(c, "POST", "/v1/plans", responses.PlanResponse, 200,
                             json=plan_body())
        assert eager["attention"]["warning"] is None

    serve(check)


def test_a_folded_export_priced_for_training_answers_a_warning_with_the_fix() -> None:
    """#35: the service says what the CLI says when BatchNorm was folded by the export."""
    folded = ROOT / "tests" / "fixtures" / "exports" / "cnn-dynamo-default.onnx"
    model = base64.b64encode(folded.read_bytes()).decode()

    async def check(c: TestClient) -> None:
        body = await answer(c, "POST", "/v1/estimate", responses.EstimateResponse, 200, json={
            "model_onnx_b64": model, "devices": ["t4"], "training": {"batch_size": 4}})
        [warning] = body["warnings"]
        assert "FuseBatchNormIntoConv" in warning and "optimize=False" in warning
        plan = await answer(c, "POST", "/v1/plans", responses.PlanResponse, 200,
                            json=plan_body(model_onnx_b64=model))
        assert plan["warnings"] == [warning]
        inference = await answer(c, "POST", "/v1/estimate", responses.EstimateResponse, 200,
                                 json={"model_onnx_b64": model, "devices": ["t4"],
                                       "training": {"batch_size": 4, "mode": "inference"}})
        assert inference["warnings"] == []

    serve(check)
