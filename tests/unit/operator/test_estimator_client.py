"""Estimator client against a real local aiohttp server: success and every error mapping."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import pytest
from aiohttp import web

from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, gpu_pools, resources, validation
from gpuplan_testing.operator_builders import LocalServer, SpecBuilder

PLAN: dict[str, Any] = {
        "plan": {"gpu_type": "NVIDIA-L4", "device": "l4", "gpu_count": 8, "gpus_per_node": 4,
                 "nodes": 2, "estimated_seconds": 7200.0, "step_time_ms": 250.0,
                 "memory_bytes_per_gpu": 20_000_000_000, "cost_usd": 9.5, "predictor": "roofline"},
        "candidates": [{"gpu_type": "NVIDIA-L4", "gpu_count": 4, "estimated_seconds": 14000.0}],
        "rejected": [{"gpu_type": "NVIDIA-A100-SXM4-80GB", "gpu_count": None,
                      "reason": "not in allow-list"}]}


SEEN = web.AppKey("seen", list)


def _app(status: int, body: Any, delay: float = 0.0) -> web.Application:
    seen: list[Any] = []

    async def plans(request: web.Request) -> web.Response:
        seen.append(await request.json())
        seen.append(request.headers.get(estimator_client.CLIENT_HEADER))
        await asyncio.sleep(delay)
        text = body if isinstance(body, str) else json.dumps(body)
        return web.Response(status=status, text=text, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/plans", plans)
    app[SEEN] = seen
    return app


def _ask(app: web.Application, timeout: float = 5) -> resources.StatusPlan:
    async def run() -> resources.StatusPlan:
        async with LocalServer(app) as srv:
            return await estimator_client.request_plan(srv.url + "/", {"x": 1}, generation=4,
                                                       timeout_seconds=timeout, tenant="team-a")
    return asyncio.run(run())


def test_ok_response_becomes_plan() -> None:
    app = _app(200, PLAN)
    plan = _ask(app)
    assert app[SEEN] == [{"x": 1}, "team-a"]  # the namespace is the estimator's client key
    assert (plan.gpu_type, plan.gpu_count, plan.nodes, plan.observed_generation) == (
        "NVIDIA-L4", 8, 2, 4)
    assert plan.alternatives[0]["gpuCount"] == 4
    assert plan.rejected[0].reason == "not in allow-list"


@pytest.mark.parametrize("reason", ["InvalidModel", "NoFeasiblePlan", "InvalidRequest"])
def test_422_carries_reason_and_details(reason: str) -> None:
    body = {"error": {"reason": reason, "message": "m", "details": [
        {"gpu_type": "NVIDIA-L4", "gpu_count": 8, "reason": "needs 30 GiB per GPU, has 22"}]}}
    with pytest.raises(errors.EstimatorRejectedError) as info:
        _ask(_app(422, body))
    assert info.value.reason == reason
    assert estimator_client.describe_rejections(info.value.details) == (
        "NVIDIA-L4 x8: needs 30 GiB per GPU, has 22")


@pytest.mark.parametrize(("status", "body", "error"), [
    (500, {"error": "boom"}, errors.EstimatorUnavailableError),
    (503, "", errors.EstimatorUnavailableError),
    (504, {"error": {"reason": "Busy", "message": "m"}}, errors.EstimatorUnavailableError),
    (504, "gateway timeout", errors.EstimatorUnavailableError),
    (429, {"error": {"reason": "TooManyRequests", "message": "m"}},
     errors.EstimatorUnavailableError),
    (200, "not json", errors.EstimatorProtocolError),
    (200, {"plan": {"gpu_type": "x"}}, errors.EstimatorProtocolError),
    (422, {"unexpected": True}, errors.EstimatorRejectedError),
])
def test_error_mapping(status: int, body: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        _ask(_app(status, body))


def test_an_estimate_that_ran_out_of_time_is_rejected_not_retried() -> None:
    """The estimator killed the estimate at its deadline and caches the 504: asking again
    only repeats it, so the TrainingJob gets a condition that says so."""
    body = {"error": {"reason": "Timeout", "message": "estimation exceeded the request's 60 s",
                      "details": []}}
    with pytest.raises(errors.EstimatorRejectedError) as info:
        _ask(_app(504, body))
    assert info.value.reason == "Timeout" and "60 s" in str(info.value)


def test_the_client_header_is_the_estimators() -> None:
    from gpuplan_estimator.interfaces.http import admission

    assert estimator_client.CLIENT_HEADER == admission.CLIENT_HEADER


def test_timeout_is_unavailable() -> None:
    with pytest.raises(errors.EstimatorUnavailableError, match="Timeout"):
        _ask(_app(200, PLAN, delay=2.0), timeout=0.3)


def test_connection_refused_is_unavailable() -> None:
    async def run() -> resources.StatusPlan:
        return await estimator_client.request_plan("http://127.0.0.1:9", {}, generation=1,
                                                   timeout_seconds=2, tenant="t")
    with pytest.raises(errors.EstimatorUnavailableError):
        asyncio.run(run())


def test_plan_keeps_the_calibration_factor_it_was_given() -> None:
    calibrated = {"plan": {**PLAN["plan"], "calibration": {"factor": 1.3, "outcomes": 4,
                                                           "level": "device+mode"}}}
    assert estimator_client.parse_plan(calibrated, generation=1).calibration_factor == 1.3
    # An estimator that predates calibration sends no object: the estimate is the model's.
    assert estimator_client.parse_plan(PLAN, generation=1).calibration_factor == 1.0


@pytest.mark.parametrize("calibration", [{"factor": 0}, {"factor": -2.0}, {"factor": "x"}, 7])
def test_a_bad_calibration_factor_is_a_protocol_error(calibration: Any) -> None:
    body = {"plan": {**PLAN["plan"], "calibration": calibration}}
    with pytest.raises(errors.EstimatorProtocolError, match="calibration"):
        estimator_client.parse_plan(body, generation=1)


def test_request_body_follows_the_contract() -> None:
    spec = validation.parse_spec(SpecBuilder().set("training.sequenceLength", 128)
                                 .set("training.dims", {"heads": 12}).set("gpuTypes", ["NVIDIA-L4"])
                                 .obj())
    pools = [gpu_pools.ClusterGpuPool("NVIDIA-L4", gpus_per_node=4, nodes=8, free_gpus=30)]
    body = estimator_client.build_request(spec, b"\x01\x02", pools)
    assert base64.b64decode(body["model_onnx_b64"]) == b"\x01\x02"
    assert body["training"] == {"batch_size": 256, "dataset_size": 1_281_167, "epochs": 1,
                                "optimizer": "adamw", "optimizer_impl": "foreach",
                                "precision": "fp32", "attention": "eager",
                                "dims": {"heads": 12, "sequence": 128}}
    assert body["objective"] == {"prefer": "cheapest", "max_gpus": 8, "deadline_seconds": 14400}
    assert body["inventory"] == [{"gpu_type": "NVIDIA-L4", "gpus_per_node": 4, "nodes": 8,
                                  "free_gpus": 30}]
    assert body["gpu_types"] == ["NVIDIA-L4"]


def test_the_attention_the_job_runs_is_sent() -> None:
    spec = validation.parse_spec(SpecBuilder().set("training.attention", "fused").obj())
    body = estimator_client.build_request(spec, b"\x01", [])
    assert body["training"]["attention"] == "fused"


def test_the_optimizer_implementation_the_job_runs_is_sent() -> None:
    spec = validation.parse_spec(SpecBuilder().set("training.optimizerImpl", "fused").obj())
    body = estimator_client.build_request(spec, b"\x01", [])
    assert body["training"]["optimizer_impl"] == "fused"


def test_a_fused_rmsprop_is_refused_naming_the_field() -> None:
    spec = SpecBuilder().set("training.optimizer", "rmsprop").set(
        "training.optimizerImpl", "fused").obj()
    problems = validation.validate_spec(spec)
    assert any(p.startswith("spec.training.optimizerImpl: torch.optim has no fused rmsprop")
               for p in problems), problems


def test_a_hf_config_model_is_sent_as_its_json() -> None:
    ref = {"configMapKeyRef": {"name": "llama", "key": "config.json"}}
    spec = validation.parse_spec(SpecBuilder().set("model", {"hfConfig": ref}).obj())
    body = estimator_client.build_request(spec, b'{"model_type": "llama"}', [])
    assert body["model_hf_config"] == {"model_type": "llama"}
    assert "model_onnx_b64" not in body


@pytest.mark.parametrize(("status", "ok"), [(201, True), (200, True), (422, False), (503, False)])
def test_outcome_answers(status: int, ok: bool) -> None:
    """200 is the estimator's answer to a job uid it already has: a resend, not a failure."""
    async def outcomes(_: web.Request) -> web.Response:
        return web.json_response({"id": 1, "duplicate": status == 200}, status=status)

    app = web.Application()
    app.router.add_post("/v1/outcomes", outcomes)

    async def run() -> None:
        async with LocalServer(app) as srv:
            await estimator_client.report_outcome(srv.url, {"job_uid": "u"}, timeout_seconds=5)
    if ok:
        asyncio.run(run())
    else:
        with pytest.raises(errors.EstimatorUnavailableError, match=str(status)):
            asyncio.run(run())


def _answers(*replies: tuple[int, dict[str, str]]) -> tuple[web.Application, list[int]]:
    """An estimator answering /v1/outcomes with `replies` in turn (status, headers), then 201."""
    served: list[int] = []

    async def outcomes(_: web.Request) -> web.Response:
        status, headers = replies[len(served)] if len(served) < len(replies) else (201, {})
        served.append(status)
        body = {"error": {"reason": "DatabaseUnavailable", "message": "database is locked"}}
        return web.json_response(body if status >= 400 else {"id": 1}, status=status,
                                 headers=headers)

    app = web.Application()
    app.router.add_post("/v1/outcomes", outcomes)
    return app, served


def _report(app: web.Application, *, deadline_seconds: float | None,
            clock_step_s: float = 0.0) -> list[float]:
    """Report one outcome to `app` with waits recorded (not slept); the clock advances by each
    wait plus `clock_step_s` per reading. Returns the waits."""
    waits: list[float] = []
    now = [0.0]

    async def wait(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    def clock() -> float:
        now[0] += clock_step_s
        return now[0]

    async def run() -> None:
        async with LocalServer(app) as srv:
            await estimator_client.report_outcome(
                srv.url, {"job_uid": "u"}, timeout_seconds=5, deadline_seconds=deadline_seconds,
                sleep=wait, clock=clock)

    asyncio.run(run())
    return waits


def test_transient_outcome_failures_are_retried_with_doubling_waits_or_retry_after() -> None:
    retry_after: dict[str, str] = {"Retry-After": "7"}
    app, served = _answers((503, {}), (429, retry_after), (504, {}))
    waits = _report(app, deadline_seconds=60)
    assert served == [503, 429, 504, 201]
    first = estimator_client.FIRST_OUTCOME_RETRY_DELAY_S
    assert waits == [first, 7.0, 4 * first]


def test_an_outcome_post_gives_up_at_its_deadline_and_says_why() -> None:
    none: dict[str, str] = {}
    app, served = _answers(*[(503, none)] * 50)
    with pytest.raises(errors.EstimatorUnavailableError,
                       match=r"answered 503: database is locked after \d+ attempt"):
        _report(app, deadline_seconds=10)
    assert 2 <= len(served) <= 4  # waits of 1, 2, 4 s fit in 10 s; 8 more would not


@pytest.mark.parametrize("status", [400, 401, 422])
def test_a_refused_outcome_is_not_sent_again(status: int) -> None:
    app, served = _answers((status, {}))
    with pytest.raises(errors.EstimatorUnavailableError, match=str(status)):
        _report(app, deadline_seconds=60)
    assert served == [status]


def test_without_a_deadline_an_outcome_is_posted_once() -> None:
    app, served = _answers((503, {}))
    with pytest.raises(errors.EstimatorUnavailableError, match="503"):
        _report(app, deadline_seconds=None)
    assert served == [503]


def test_the_real_estimators_rejections_are_described_per_gpu_type_and_field() -> None:
    """Against `gpuplan serve`'s app: a NoFeasiblePlan's details are one rejection per GPU type,
    an InvalidRequest's one object per field (issue #20); both read as one line each."""
    import functools
    import pathlib

    import onnx

    from gpuplan_estimator.interfaces.http import service, work
    from gpuplan_testing.contexts import roofline_context

    light = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    model = base64.b64encode((light / "light_resnet50.onnx").read_bytes()).decode()
    body = {"model_onnx_b64": model, "training": {"batch_size": 1, "dataset_size": 1000},
            "objective": {"max_gpus": 1, "deadline_seconds": 1e-6},
            "inventory": [{"gpu_type": "NVIDIA-L4", "gpus_per_node": 4},
                          {"gpu_type": "TPU-v5", "gpus_per_node": 4}]}
    app = service.make_app(service.ServiceState(functools.partial(
        work.given_context, roofline_context())), service.ServiceSettings(bundle_poll_s=3600))

    async def ask_both() -> list[errors.EstimatorRejectedError]:
        got = []
        async with LocalServer(app) as srv:
            for sent in (body, {**body, "training": {"batch_size": True}}):
                with pytest.raises(errors.EstimatorRejectedError) as info:
                    await estimator_client.request_plan(srv.url, sent, generation=1,
                                                        timeout_seconds=30, tenant="t")
                got.append(info.value)
        return got

    infeasible, invalid = asyncio.run(ask_both())
    assert infeasible.reason == "NoFeasiblePlan"
    lines = estimator_client.describe_rejections(infeasible.details).split("; ")
    assert lines[0] == "TPU-v5: not in the GPU catalog, no estimate possible"
    assert lines[1].startswith("NVIDIA-L4: ") and "deadline" in lines[1]
    assert invalid.reason == "InvalidRequest"
    assert estimator_client.describe_rejections(invalid.details) == (
        "training.batch_size: Input should be a valid integer")


def test_a_plan_body_goes_out_in_pieces_with_its_length_first() -> None:
    """The model's base64 is written a piece at a time (no serialised copy of the body) and
    Content-Length is exact, so the estimator can refuse an oversized body before reading it
    (issue #33); what arrives is the JSON of the body."""
    model = base64.b64encode(bytes(range(256)) * 20_000).decode()  # 5 MB: several pieces
    body = {"model_onnx_b64": model, "training": {"batch_size": 8, "note": "é"}}
    seen: list[Any] = []

    async def plans(request: web.Request) -> web.Response:
        seen.append((request.content_length, request.headers.get("Transfer-Encoding"),
                     await request.json()))
        return web.json_response(PLAN)

    app = web.Application(client_max_size=16 * 2**20)
    app.router.add_post("/v1/plans", plans)

    async def run() -> None:
        async with LocalServer(app) as srv:
            await estimator_client.request_plan(srv.url, body, generation=1,
                                                timeout_seconds=10, tenant="team-a")

    asyncio.run(run())
    size, pieces = estimator_client.encoded_body(body)

    async def count() -> int:
        return len([p async for p in pieces])

    assert asyncio.run(count()) >= len(model) // estimator_client.BODY_CHUNK_CHARS + 2
    assert seen == [(size, None, body)]
    assert size == len(json.dumps(body).encode())
