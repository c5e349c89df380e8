"""Issue #34: a named parallel layout is estimated per rank through the planner's own path, the
same through `gpuplan estimate --gpus ...`, `POST /v1/estimate` and a plan's choice."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.cli import main, plans
from gpuplan_estimator.interfaces.http import layout_wire, service, wire, work
from gpuplan_estimator.planning import named_layouts, planner
from gpuplan_testing.contexts import roofline_context
from gpuplan_testing.moe_configs import MIXTRAL_TINY, MIXTRAL_WIDE

# A small GPT-2 shape: 8 blocks of width 256, so a plan and an estimate take seconds.
TINY = {"model_type": "gpt2", "n_embd": 256, "n_layer": 8, "n_head": 8, "n_positions": 256,
        "vocab_size": 4096}
TRAINING = {"batch_size": 64, "dataset_size": 6400, "epochs": 1, "optimizer": "adamw",
            "precision": "fp16", "dims": {"sequence": 256}}


def estimate_body(layout: dict[str, Any], device: str = "a100-sxm4-40gb",
                  model: dict[str, Any] = TINY) -> dict[str, Any]:
    return {"model_hf_config": model, "training": TRAINING, "devices": [device],
            "layout": layout}


def by_name(doc: dict[str, Any]) -> dict[str, Any]:
    """The layout a plan's candidate names, as an estimate request's `layout`."""
    par, st = doc["parallelism"], doc["strategy"]
    return {"gpus": doc["gpu_count"], "dp": par["dp"], "tp": par["tp"], "pp": par["pp"],
            "gpus_per_node": doc["gpus_per_node"], "fsdp": st["fsdp"],
            "zero_stage": st["zero_stage"], "checkpointing": st["checkpointing"],
            "micro_batch": par["micro_batch"], "gradient_accumulation": par["micro_batches"],
            "ep": par["ep"]}


@pytest.mark.parametrize(("device", "model"), [
    ("t4", TINY), ("a100-sxm4-40gb", TINY),
    # A mixture of experts whose fp16 experts crowd a T4: the plan splits them (ep > 1).
    ("t4", MIXTRAL_WIDE)])
def test_a_plans_choice_estimated_by_name_has_the_same_step_and_memory(
        device: str, model: dict[str, Any]) -> None:
    ctx = roofline_context()
    body = {"model_hf_config": model, "training": TRAINING,
            "objective": {"prefer": "fastest", "max_gpus": 8},
            "inventory": [{"gpu_type": device, "gpus_per_node": 4, "nodes": 2}]}
    chosen = json_documents.plan_request_json(wire.parse_plan_request(body), ctx)["plan"]
    assert chosen["gpu_count"] == 8
    assert (chosen["parallelism"]["ep"] > 1) == (model is MIXTRAL_WIDE)
    doc = work.estimate(wire.parse_estimate_request(estimate_body(by_name(chosen), device,
                                                                  model)), ctx)
    [rank] = doc["layout_estimates"]
    # The plan's JSON rounds to 4 decimals; every part agrees to the last of them.
    assert round(rank["step_time_ms"], 4) == chosen["step_time_ms"]
    assert {k: round(v, 4) for k, v in rank["step_parts_ms"].items()} == chosen["step_ms"]
    assert rank["memory_per_rank"] == chosen["memory"]
    if device == "a100-sxm4-40gb":  # the fastest way there is tensor parallel: both paths
        assert chosen["parallelism"]["tp"] == 2
    if model is MIXTRAL_WIDE:
        assert rank["step_ms"]["exposed_comm"]["all-to-all"] > 0


def one_rank(body: dict[str, Any]) -> dict[str, Any]:
    """The one device's per-rank answer, checked against the response model and for parts
    that add up to the step."""
    doc = work.estimate(wire.parse_estimate_request(body), roofline_context())
    layout_wire.LayoutEstimateResponse.model_validate(doc)
    [rank] = doc["layout_estimates"]
    step = rank["step_ms"]
    parts = [step["compute"], *step["exposed_comm"].values(), step["pipeline_bubble"],
             step["host"]]
    assert math.isclose(sum(parts), rank["step_time_ms"], rel_tol=1e-12)
    return rank


def test_the_per_rank_answer_adds_up_and_reports_throughput_in_the_fields_units() -> None:
    layout = {"gpus": 8, "dp": 2, "tp": 2, "pp": 2, "micro_batch": 4,
              "checkpointing": "full", "zero_stage": 1}
    rank = one_rank(estimate_body(layout))
    step = rank["step_ms"]
    assert step["pipeline_bubble"] > 0 and step["exposed_comm"]["p2p"] > 0
    assert step["exposed_comm"]["all-reduce"] > 0  # Megatron's TP all-reduces
    assert rank["layout"]["micro_batches"] == 64 // (2 * 4)
    tokens = 64 * 256 / (rank["step_time_ms"] / 1000) / 8
    assert rank["throughput"]["tokens_per_s_per_gpu"] == pytest.approx(tokens)
    mfu = rank["model_flops_per_step"] / (rank["step_time_ms"] / 1000 * 8
                                          * rank["peak_flops_per_s"])
    assert rank["mfu"] == pytest.approx(mfu) and 0 < rank["mfu"] < 1
    assert rank["memory_per_rank"]["recompute_bytes"] > 0  # full checkpointing rebuilds a block


def test_interleaving_shrinks_the_bubble_and_sends_more() -> None:
    ctx = roofline_context()
    base = {"gpus": 4, "dp": 1, "tp": 1, "pp": 4, "micro_batch": 4}
    one = work.estimate(wire.parse_estimate_request(estimate_body(base)), ctx)
    two = work.estimate(wire.parse_estimate_request(estimate_body(
        {**base, "pp_schedule": "interleaved", "virtual_stages": 2})), ctx)
    a, b = one["layout_estimates"][0]["step_ms"], two["layout_estimates"][0]["step_ms"]
    # Half the bubble of stages that now also send twice as much (Narayanan et al. §2.2.2).
    assert b["pipeline_bubble"] < a["pipeline_bubble"]
    assert b["pipeline_bubble"] == pytest.approx(a["pipeline_bubble"] / 2, rel=0.05)
    assert b["exposed_comm"]["p2p"] == pytest.approx(2 * a["exposed_comm"]["p2p"])
    assert b["compute"] == pytest.approx(a["compute"])


@pytest.mark.parametrize(("layout", "fields"), [
    ({"gpus": 8, "dp": 3, "tp": 2}, ["layout.gpus"]),
    ({"gpus": 8, "dp": 8, "zero_stage": 2, "fsdp": "full"}, ["layout.zero_stage"]),
    ({"gpus": 8, "dp": 4, "tp": 2, "fsdp": "hybrid"}, ["layout.fsdp"]),
    ({"gpus": 8, "dp": 8, "micro_batch": 3}, ["layout.micro_batch"]),
    ({"gpus": 4, "dp": 1, "pp": 4, "gradient_accumulation": 2, "pp_schedule": "interleaved",
      "virtual_stages": 2}, ["layout.virtual_stages"]),
    ({"gpus": 8, "dp": 8, "checkpointing": "selective"}, ["layout.checkpointing"]),
    # TP past the node of 8, and past the 8 heads: both reasons.
    ({"gpus": 16, "dp": 1, "tp": 16}, ["layout.tp", "layout.tp"]),
])
def test_a_bad_layout_is_refused_on_its_field(layout: dict[str, Any], fields: list[str]
                                              ) -> None:
    req = wire.parse_estimate_request(estimate_body(layout))
    with pytest.raises(wire.InvalidFieldsError) as info:
        work.estimate(req, roofline_context())
    assert [path for path, _ in info.value.problems] == fields


def test_the_request_model_names_the_json_path() -> None:
    with pytest.raises(wire.InvalidFieldsError) as info:
        wire.parse_estimate_request(estimate_body({"gpus": 8, "dp": 8, "zero_stage": 4,
                                                   "pp_schedule": "gpipe"}))
    assert {p for p, _ in info.value.problems} == {"layout.zero_stage", "layout.pp_schedule"}


@pytest.mark.parametrize(("model", "flags", "layout"), [
    (TINY, ["--tp", "2", "--pp", "2", "--micro-batch", "4", "--pp-schedule", "interleaved:2"],
     {"gpus": 8, "dp": 2, "tp": 2, "pp": 2, "micro_batch": 4, "pp_schedule": "interleaved",
      "virtual_stages": 2}),
    (MIXTRAL_TINY, ["--ep", "4", "--zero", "1", "--micro-batch", "4"],
     {"gpus": 8, "dp": 8, "ep": 4, "zero_stage": 1, "micro_batch": 4}),
])
def test_the_cli_prints_what_the_service_answers(tmp_path: Path, model: dict[str, Any],
                                                 flags: list[str], layout: dict[str, Any],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "model.json"
    config.write_text(json.dumps(model))
    argv = ["estimate", "--hf-config", str(config), "--batch", "64", "--dim", "sequence=256",
            "--precision", "fp16", "--optimizer", "adamw", "--device", "a100-sxm4-40gb",
            "--gpus", "8", *flags, "-o", "json"]
    assert main.main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    served = work.estimate(wire.parse_estimate_request(estimate_body(layout, model=model)),
                           plans.load_context(None))  # the CLI's predictor: the same bundle
    assert printed["layout_estimates"] == served["layout_estimates"]
    assert printed["layout_estimates"][0]["layout"]["ep"] == layout.get("ep", 1)


@pytest.mark.parametrize(("flags", "named"), [
    (["--gpus", "8", "--dp", "3", "--tp", "2"], "--gpus"),
    (["--gpus", "8", "--zero", "2", "--fsdp", "full"], "--zero"),
    (["--gpus", "8", "--micro-batch", "3"], "--micro-batch"),
    (["--gpus", "8", "--pp", "2", "--pp-schedule", "interleaved"], "--pp-schedule"),
    (["--gpus", "8", "--checkpointing", "per-block:x"], "--checkpointing"),
    (["--gpus", "8", "--ep", "2"], "--ep"),  # the tiny GPT-2 is dense
])
def test_the_cli_names_the_flag_of_a_bad_layout(tmp_path: Path, flags: list[str], named: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "tiny.json"
    config.write_text(json.dumps(TINY))
    code = main.main(["estimate", "--hf-config", str(config), "--batch", "64", "--dim",
                      "sequence=256", "--device", "a100-sxm4-40gb", *flags])
    assert code != 0
    assert capsys.readouterr().err.strip().startswith(f"gpuplan: error: {named}: ")


@pytest.mark.parametrize(("model", "layout"), [
    (TINY, {"gpus": 8, "dp": 4, "tp": 2, "zero_stage": 1}),
    (MIXTRAL_TINY, {"gpus": 8, "dp": 8, "ep": 8, "zero_stage": 2}),
])
def test_the_service_answers_a_layout_with_the_handlers_numbers(model: dict[str, Any],
                                                                layout: dict[str, Any]) -> None:
    expected = work.estimate(wire.parse_estimate_request(estimate_body(layout, model=model)),
                             roofline_context())

    async def main_() -> None:
        app = service.make_app(service.ServiceState(roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600))
        async with TestClient(TestServer(app)) as client:
            resp = await client.post("/v1/estimate", json=estimate_body(layout, model=model))
            assert resp.status == 200, await resp.text()
            body = await resp.json()
            layout_wire.LayoutEstimateResponse.model_validate(body)
            assert body["layout_estimates"] == expected["layout_estimates"]
            bad = await client.post("/v1/estimate", json=estimate_body({"gpus": 8, "dp": 3}))
            assert bad.status == 422
            details = (await bad.json())["error"]["details"]
            assert [d["field"] for d in details] == ["layout.gpus"]

    asyncio.run(main_())


def test_a_named_layout_needs_training_and_blocks_for_model_parallelism() -> None:
    req = wire.parse_estimate_request({**estimate_body({"gpus": 2, "dp": 2}),
                                       "training": {**TRAINING, "mode": "inference"}})
    with pytest.raises(InvalidRequestError, match="inference"):
        named_layouts.estimate_layout(req, roofline_context())


def plan_body(layout: dict[str, Any] | None, *, gpus_per_node: int = 4) -> dict[str, Any]:
    return {"model_hf_config": TINY, "training": TRAINING,
            "objective": {"prefer": "fastest", "max_gpus": 8},
            "inventory": [{"gpu_type": "a100-sxm4-40gb", "gpus_per_node": gpus_per_node,
                           "nodes": 2}],
            **({"layout": layout} if layout else {})}


def test_a_pinned_layout_is_the_plans_only_choice_and_prices_as_its_estimate() -> None:
    ctx = roofline_context()
    layout = {"gpus": 8, "dp": 2, "tp": 2, "pp": 2, "micro_batch": 4}
    doc = json_documents.plan_request_json(wire.parse_plan_request(plan_body(layout)), ctx)
    chosen = doc["plan"]
    assert [c["gpu_count"] for c in doc["candidates"]] == [8]
    assert {k: chosen["parallelism"][k] for k in ("dp", "tp", "pp", "micro_batch")} == {
        "dp": 2, "tp": 2, "pp": 2, "micro_batch": 4}
    [rank] = work.estimate(wire.parse_estimate_request(
        estimate_body({**layout, "gpus_per_node": 4})), ctx)["layout_estimates"]
    assert round(rank["step_time_ms"], 4) == chosen["step_time_ms"]


def test_a_pinned_layout_the_pools_cannot_run_is_refused_with_the_reason() -> None:
    layout = {"gpus": 8, "dp": 1, "tp": 8}  # TP over 8 GPUs, nodes of 4
    with pytest.raises(planner.NoFeasiblePlanError) as info:
        planner.plan_request(wire.parse_plan_request(plan_body(layout)), roofline_context())
    [(gpu_type, why)] = info.value.rejections
    assert gpu_type == "a100-sxm4-40gb"
    assert why.startswith("x8: pinned layout: layout.tp: 8 GPUs cannot form TP groups inside "
                          "nodes of 4")


def moe_rank(layout: dict[str, Any]) -> dict[str, Any]:
    return one_rank(estimate_body(layout, device="h100-sxm", model=MIXTRAL_TINY))


def test_expert_parallelism_splits_the_experts_and_adds_all_to_alls_that_cross_nodes() -> None:
    # 16 GPUs on nodes of 4: EP groups of 2 and 4 stay inside a node, 8 and 16 cross them.
    ranks = {ep: moe_rank({"gpus": 16, "dp": 16, "ep": ep, "gpus_per_node": 4})
             for ep in (1, 2, 4, 8)}
    alltoall = {ep: r["step_ms"]["exposed_comm"]["all-to-all"] for ep, r in ranks.items()}
    experts = {ep: r["memory_per_rank"]["expert_states_bytes"] for ep, r in ranks.items()}
    assert alltoall[1] == 0 and ranks[1]["memory_per_rank"]["dispatch_buffers_bytes"] == 0
    assert 0 < alltoall[2] < alltoall[4] < alltoall[8]
    # (ep-1)/ep of the tokens leave a rank: 7/8 is 7/6 of 3/4, but over the network, not
    # the node's NVLink.
    assert alltoall[8] > 3 * (7 / 6) * alltoall[4]
    for ep in (2, 4, 8):
        assert experts[ep] == pytest.approx(experts[1] / ep, rel=1e-6)
        assert ranks[ep]["memory_per_rank"]["dispatch_buffers_bytes"] > 0
        assert ranks[ep]["layout"]["ep"] == ep
        # The dense work is the same on every rank: only the communication moves.
        assert ranks[ep]["step_parts_ms"]["compute"] == ranks[1]["step_parts_ms"]["compute"]
    assert ranks[8]["memory_per_rank"]["total_bytes"] < ranks[1]["memory_per_rank"][
        "total_bytes"]


@pytest.mark.parametrize(("model", "layout", "fields"), [
    (TINY, {"gpus": 8, "dp": 8, "ep": 2}, ["layout.ep"]),  # dense: no experts
    (MIXTRAL_TINY, {"gpus": 4, "dp": 4, "ep": 8}, ["layout.ep"]),  # 8 !| dp=4
    (MIXTRAL_TINY, {"gpus": 16, "dp": 16, "ep": 16}, ["layout.ep"]),  # 16 !| 8 experts
    (MIXTRAL_TINY, {"gpus": 8, "dp": 8, "ep": 2, "fsdp": "full"}, ["layout.fsdp"]),
    (MIXTRAL_TINY, {"gpus": 8, "dp": 8, "ep": 2, "zero_stage": 3}, ["layout.zero_stage"]),
])
def test_an_expert_layout_that_cannot_run_is_refused_on_its_field(
        model: dict[str, Any], layout: dict[str, Any], fields: list[str]) -> None:
    req = wire.parse_estimate_request(estimate_body(layout, model=model))
    with pytest.raises(wire.InvalidFieldsError) as info:
        work.estimate(req, roofline_context())
    assert [path for path, _ in info.value.problems] == fields
    assert "ep" in str(info.value) or "expert" in str(info.value)


def test_the_request_model_bounds_ep() -> None:
    with pytest.raises(wire.InvalidFieldsError) as info:
        wire.parse_estimate_request(estimate_body({"gpus": 8, "dp": 8, "ep": 0},
                                                  model=MIXTRAL_TINY))
    assert [p for p, _ in info.value.problems] == ["layout.ep"]
