"""The estimator HTTP service, in-process over a real socket (aiohttp's test server)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import pathlib
from collections.abc import Awaitable, Callable
from typing import Any

import onnx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator.graph import examples
from gpuplan_estimator.interfaces.http import service
from gpuplan_estimator.planning import planner
from gpuplan_testing import onnx_models
from gpuplan_testing.contexts import roofline_context

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RESNET50_B64 = base64.b64encode((LIGHT / "light_resnet50.onnx").read_bytes()).decode()

INVENTORY = [
    {"gpu_type": "NVIDIA-H100-80GB-HBM3", "gpus_per_node": 8, "nodes": 4, "free_gpus": 32},
    {"gpu_type": "NVIDIA-L4", "gpus_per_node": 4, "nodes": 8, "free_gpus": 32},
]


def plan_body(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model_onnx_b64": RESNET50_B64,
        "training": {"batch_size": 1, "dataset_size": 10000, "epochs": 1, "optimizer": "sgd"},
        "objective": {"prefer": "cheapest", "max_gpus": 8},
        "inventory": INVENTORY,
    }
    body.update(overrides)
    return body


def run(check: Callable[[TestClient], Awaitable[None]],
        settings: service.ServiceSettings | None = None,
        loader: Callable[[], planner.PlannerContext] = roofline_context) -> None:
    async def main() -> None:
        state = service.ServiceState(loader)
        app = service.make_app(state, settings or service.ServiceSettings(bundle_poll_s=3600))
        async with TestClient(TestServer(app)) as client:
            await check(client)

    asyncio.run(main())


def test_plan_for_resnet50_picks_an_inventory_gpu() -> None:
    async def check(client: TestClient) -> None:
        resp = await client.post("/v1/plans", json=plan_body())
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        assert body["plan"]["gpu_type"] in {"NVIDIA-H100-80GB-HBM3", "NVIDIA-L4"}
        assert body["plan"]["estimated_seconds"] > 0
        assert body["candidates"][0] == body["plan"]

    run(check)


def test_fixed_batch_model_is_scaled_per_sample_for_a_large_global_batch() -> None:
    async def check(client: TestClient) -> None:
        training = {"batch_size": 256, "dataset_size": 1281167, "epochs": 1, "optimizer": "sgd"}
        resp = await client.post("/v1/plans", json=plan_body(
            training=training, objective={"prefer": "fastest", "max_gpus": 8}))
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        by_count = {(c["gpu_type"], c["gpu_count"]): c for c in body["candidates"]}
        h100 = "NVIDIA-H100-80GB-HBM3"
        one, eight = by_count.get((h100, 1)), by_count[(h100, 8)]
        assert eight["per_gpu_batch"] == 32
        if one is not None:
            assert one["memory_bytes_per_gpu"] > eight["memory_bytes_per_gpu"]
            assert one["estimated_seconds"] > eight["estimated_seconds"]

    run(check)


def test_deadline_nobody_meets_is_no_feasible_plan_with_reasons() -> None:
    async def check(client: TestClient) -> None:
        body = plan_body(objective={"prefer": "cheapest", "max_gpus": 2, "deadline_seconds": 1e-6})
        resp = await client.post("/v1/plans", json=body)
        assert resp.status == 422
        err = (await resp.json())["error"]
        assert err["reason"] == "NoFeasiblePlan"
        rejected = {d["gpu_type"]: d for d in err["details"]}
        assert rejected["NVIDIA-L4"]["gpu_count"] is None
        assert "deadline" in rejected["NVIDIA-L4"]["reason"]

    run(check)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"model_onnx_b64": "***"}, "model_onnx_b64"),
        ({"training": {"batch_size": 0}}, "training.batch_size"),
        ({"objective": {"prefer": "quickest"}}, "objective.prefer"),
        ({"inventory": []}, "inventory"),
    ],
)
def test_invalid_fields_are_named(body: dict[str, Any], field: str) -> None:
    async def check(client: TestClient) -> None:
        resp = await client.post("/v1/plans", json=plan_body(**body))
        assert resp.status == 422
        err = (await resp.json())["error"]
        assert err["reason"] == "InvalidRequest"
        assert field in err["message"]
        assert [d["field"] for d in err["details"]] == [field]

    run(check)


def test_a_hf_config_instead_of_onnx_is_planned_and_estimated() -> None:
    """`model_hf_config` (what a TrainingJob's spec.model.hfConfig ConfigMap holds) is built
    into its graph: GPT-2 by the zoo, Llama block by block by hf_blocks."""
    gpt2 = json.loads(examples.GPT2_CONFIG.read_text())
    llama = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
             "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2,
             "intermediate_size": 160, "vocab_size": 128}

    async def check(client: TestClient) -> None:
        training = {"batch_size": 8, "dataset_size": 1000, "epochs": 1,
                    "dims": {"sequence": 128}}
        body = plan_body(training=training, model_hf_config=gpt2)
        del body["model_onnx_b64"]
        resp = await client.post("/v1/plans", json=body)
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["plan"]["step_time_ms"] > 0
        estimate_body = {"model_hf_config": llama, "devices": ["t4"],
                         "training": {"batch_size": 2, "dims": {"sequence": 16}}}
        resp = await client.post("/v1/estimate", json=estimate_body)
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["model"]["parameters"] > 0
        both = plan_body(training=training, model_hf_config=gpt2)
        resp = await client.post("/v1/plans", json=both)
        assert resp.status == 422
        assert "exactly one of model_onnx_b64" in (await resp.json())["error"]["message"]
        resp = await client.post("/v1/estimate", json={**estimate_body,
                                                       "model_hf_config": {"n_layer": 2}})
        assert resp.status == 422
        assert "model_hf_config" in (await resp.json())["error"]["message"]

    run(check)


def test_a_whisper_config_is_estimated_over_http_as_on_the_command_line() -> None:
    """An encoder-decoder (#34) through the service's hf-config path: the same graph as
    `gpuplan estimate --hf-config whisper_tiny.json` builds."""
    from gpuplan_estimator.interfaces.cli import main

    path = examples.GPT2_CONFIG.parent / "whisper_tiny.json"
    whisper = json.loads(path.read_text())
    served: dict[str, Any] = {}

    async def check(client: TestClient) -> None:
        body = {"model_hf_config": whisper, "devices": ["t4"],
                "training": {"batch_size": 2, "dims": {"sequence": 64}}}
        resp = await client.post("/v1/estimate", json=body)
        assert resp.status == 200, await resp.text()
        served.update(await resp.json())

    run(check)
    cli = io.StringIO()
    with contextlib.redirect_stdout(cli):
        assert main.main(["estimate", "--hf-config", str(path), "--batch", "2", "--dim",
                          "sequence=64", "--device", "t4", "-o", "json"]) == 0
    local = json.loads(cli.getvalue())
    assert served["model"]["parameters"] == local["model"]["parameters"] > 37_000_000
    assert served["model"]["flops_per_step"] == local["model"]["flops_per_step"]
    assert served["devices"][0]["step_time_ms"] > 0


def test_a_flood_of_bad_fields_is_answered_briefly_with_per_field_details() -> None:
    """Issue #21: 64 MB of `{}` inventory entries made one error per entry (11.5 GB RSS). Now
    the pool count is capped, at most 20 field errors are kept, and each is a detail."""
    async def check(client: TestClient) -> None:
        resp = await client.post("/v1/plans", json=plan_body(inventory=[{}] * 200_000))
        assert resp.status == 422
        err = (await resp.json())["error"]
        assert err["details"] == [{"field": "inventory",
                                   "message": "at most 1000 GPU pools, got 200000"}]
        resp = await client.post("/v1/plans", json=plan_body(inventory=[{}] * 500))
        err = (await resp.json())["error"]
        # Each entry lacks gpu_type and gpus_per_node: 1000 errors, 20 of them reported.
        assert len(err["details"]) == 20 and err["message"].endswith("; and 980 more")
        assert err["details"][:2] == [
            {"field": "inventory[0].gpu_type", "message": "Field required"},
            {"field": "inventory[0].gpus_per_node", "message": "Field required"}]
        assert len(await resp.read()) < 4096
        bad = plan_body(training={"batch_size": 0, "dataset_size": 10},
                        objective={"deadline_seconds": 1e306, "budget_usd": -1})
        err = (await (await client.post("/v1/plans", json=bad)).json())["error"]
        assert [d["field"] for d in err["details"]] == [
            "training.batch_size", "objective.deadline_seconds", "objective.budget_usd"]

    run(check, settings=service.ServiceSettings(max_body_bytes=2**24, bundle_poll_s=3600))


def test_broken_onnx_is_invalid_model() -> None:
    async def check(client: TestClient) -> None:
        garbage = base64.b64encode(b"\x08\x07this is not a model").decode()
        resp = await client.post("/v1/plans", json=plan_body(model_onnx_b64=garbage))
        assert resp.status == 422
        assert (await resp.json())["error"]["reason"] == "InvalidModel"

    run(check)


def test_invalid_json_and_oversized_bodies_get_json_errors() -> None:
    async def check(client: TestClient) -> None:
        resp = await client.post("/v1/plans", data=b"{not json",
                                 headers={"Content-Type": "application/json"})
        assert resp.status == 400
        err = (await resp.json())["error"]
        assert err["reason"] == "InvalidJSON" and "invalid JSON" in err["message"]
        resp = await client.post("/v1/plans", data=b"x" * 4096)
        assert resp.status == 413
        assert (await resp.json())["error"]["reason"] == "RequestTooLarge"

    run(check, settings=service.ServiceSettings(max_body_bytes=2048, bundle_poll_s=3600))


def test_estimate_endpoint_returns_the_cli_schema() -> None:
    async def check(client: TestClient) -> None:
        body = {"model_onnx_b64": RESNET50_B64, "training": {"batch_size": 1},
                "devices": ["Tesla T4", "NVIDIA-H100-80GB-HBM3"]}
        resp = await client.post("/v1/estimate", json=body)
        assert resp.status == 200, await resp.text()
        doc = await resp.json()
        assert [d["device"] for d in doc["devices"]] == ["t4", "h100-sxm-80gb"]
        assert doc["devices"][0]["step_time_ms"] > doc["devices"][1]["step_time_ms"]
        body["training"] = {"batch_size": 2}  # the light ResNet-50, fixed batch 1, re-batched
        resp = await client.post("/v1/estimate", json=body)
        assert resp.status == 200, await resp.text()
        doubled = await resp.json()
        assert doubled["settings"]["batch_size"] == 2
        assert doubled["devices"][0]["step_time_ms"] > doc["devices"][0]["step_time_ms"]
        folded = base64.b64encode(onnx_models.batch_folded_model().SerializeToString()).decode()
        body = {"model_onnx_b64": folded, "training": {"batch_size": 2}, "devices": ["t4"]}
        resp = await client.post("/v1/estimate", json=body)
        assert resp.status == 422
        assert "training.batch_size" in (await resp.json())["error"]["message"]

    run(check)


def test_health_models_and_metrics() -> None:
    async def check(client: TestClient) -> None:
        assert (await client.get("/healthz")).status == 200
        models = await (await client.get("/v1/models")).json()  # waits for start-up (#33)
        ready = await client.get("/readyz")
        assert ready.status == 200
        assert models["source"] == "roofline"
        await client.post("/v1/plans", json=plan_body(inventory=[]))
        text = await (await client.get("/metrics")).text()
        assert 'gpuplan_estimator_http_requests_total{code="422",endpoint="/v1/plans"} 1.0' in text

    run(check)


def test_new_bundle_is_swapped_in_atomically() -> None:
    sources = iter(["bundle-a", "bundle-a", "bundle-b"])

    def loader() -> planner.PlannerContext:
        ctx = roofline_context()
        return planner.PlannerContext(ctx.catalog, ctx.predictor, next(sources))

    state = service.ServiceState(loader)
    assert state.load() is True
    first = state.context
    assert state.load() is False
    assert state.context is first
    assert state.load() is True
    assert state.context is not None and state.context.predictor_source == "bundle-b"


def test_job_outcomes_are_stored_with_the_canonical_device() -> None:
    stored: list[tuple[Any, str]] = []

    def sink(req: Any, device: str) -> tuple[int, bool]:
        stored.append((req, device))
        return len(stored), True

    async def main() -> None:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600), outcome_sink=sink)
        async with TestClient(TestServer(app)) as client:
            body = {"job_uid": "u1", "gpu_type": "NVIDIA-L4", "gpu_count": 2,
                    "estimated_seconds": 100.0, "actual_seconds": 130.0}
            resp = await client.post("/v1/outcomes", json=body)
            assert resp.status == 201, await resp.text()
            assert (await resp.json())["device"] == "l4"
            bad = await client.post("/v1/outcomes", json={**body, "actual_seconds": -1,
                                                          "gpu_type": ""})
            assert bad.status == 422
            message = (await bad.json())["error"]["message"]
            assert "gpu_type" in message and "actual_seconds" in message
            unknown = await client.post("/v1/outcomes", json={**body, "gpu_type": "TPU-v5"})
            assert unknown.status == 422
            assert [d["field"] for d in (await unknown.json())["error"]["details"]] == [
                "gpu_type"]
            # Issue #21: 1e306 seconds, an infinite factor or 10^20 GPUs poisoned calibration.
            hostile = await client.post("/v1/outcomes", json={
                **body, "actual_seconds": 1e306, "calibration_factor": 1e300,
                "gpu_count": 10**20})
            assert hostile.status == 422
            details = (await hostile.json())["error"]["details"]
            assert [d["field"] for d in details] == [
                "gpu_count", "actual_seconds", "calibration_factor"]

    asyncio.run(main())
    assert [(r.job_uid, r.gpu_count, d) for r, d in stored] == [("u1", 2, "l4")]


def test_outcomes_into_a_real_sqlite_perf_database(tmp_path: pathlib.Path) -> None:
    from gpuplan_estimator.interfaces.cli import serving
    from gpuplan_estimator.interfaces.http import wire
    from gpuplan_estimator.perfdb import PerfStore

    url = f"sqlite:///{tmp_path / 'perf.db'}"
    sink = serving.perfdb_outcome_sink(url)
    sink(wire.OutcomeRequest("u2", "NVIDIA-L4", 1, 50.0, 75.0), "l4")
    frame = PerfStore.open(url).job_outcomes()
    assert list(frame["job_uid"]) == ["u2"]
    assert float(frame["drift_ratio"].iloc[0]) == pytest.approx(1.5)
