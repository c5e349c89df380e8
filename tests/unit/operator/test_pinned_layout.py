"""Issue #34: a TrainingJob's `spec.layout` reaches the planner through the operator's request
builder; the plan honours it with the numbers an estimate of that layout gives, or refuses it
with the reason the operator puts on the Estimated condition."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplan_estimator.interfaces import json_documents
from gpuplan_estimator.interfaces.http import layout_wire, wire, work
from gpuplan_estimator.parallel import named, strategies
from gpuplan_estimator.planning import planner
from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, gpu_pools, validation
from gpuplan_testing.contexts import roofline_context
from gpuplan_testing.moe_configs import MIXTRAL_TINY
from gpuplan_testing.operator_builders import SpecBuilder

TINY = {"model_type": "gpt2", "n_embd": 256, "n_layer": 8, "n_head": 8, "n_positions": 256,
        "vocab_size": 4096}
CRD = Path(__file__).parents[3] / "crds" / "trainingjobs.gpuplan.io.yaml"
POOLS = [gpu_pools.ClusterGpuPool("a100-sxm4-40gb", gpus_per_node=4, nodes=2, free_gpus=8)]


def spec_with(layout: dict[str, Any]) -> dict[str, Any]:
    ref = {"configMapKeyRef": {"name": "tiny", "key": "config.json"}}
    return (SpecBuilder().set("model", {"hfConfig": ref}).set("training.batchSize", 64)
            .set("training.datasetSize", 6400).set("training.precision", "fp16")
            .set("training.sequenceLength", 256).set("objective.prefer", "fastest")
            .set("layout", layout).obj())


def request_for(layout: dict[str, Any], model: dict[str, Any] = TINY) -> dict[str, Any]:
    spec = validation.parse_spec(spec_with(layout))
    return estimator_client.build_request(spec, json.dumps(model).encode(), POOLS)


@pytest.mark.parametrize(("model", "layout", "expected", "chosen_as"), [
    (TINY, {"gpus": 8, "dp": 4, "tp": 2, "zeroStage": 1, "microBatch": 8,
            "checkpointing": "full"},
     {"gpus": 8, "dp": 4, "tp": 2, "zero_stage": 1, "micro_batch": 8, "checkpointing": "full"},
     ({"tp": 2, "ep": 1}, "zero-1 + checkpoint full")),
    # A mixture of experts split over 4 of the 8 data-parallel ranks (expert parallelism).
    (MIXTRAL_TINY, {"gpus": 8, "dp": 8, "ep": 4, "zeroStage": 1, "microBatch": 4},
     {"gpus": 8, "dp": 8, "ep": 4, "zero_stage": 1, "micro_batch": 4},
     ({"tp": 1, "ep": 4}, "zero-1 + accumulate x2")),
])
def test_the_pinned_layout_is_planned_with_its_estimates_numbers(
        model: dict[str, Any], layout: dict[str, Any], expected: dict[str, Any],
        chosen_as: tuple[dict[str, int], str]) -> None:
    body = request_for(layout, model)
    assert body["layout"] == expected
    ctx = roofline_context()
    chosen = json_documents.plan_request_json(wire.parse_plan_request(body), ctx)["plan"]
    assert ({k: chosen["parallelism"][k] for k in ("tp", "ep")},
            chosen["strategy"]["label"]) == chosen_as
    estimate = {key: body[key] for key in ("model_hf_config", "training")}
    estimate["layout"] = {**body["layout"], "gpus_per_node": 4}
    estimate["devices"] = ["a100-sxm4-40gb"]
    [rank] = work.estimate(wire.parse_estimate_request(estimate), ctx)["layout_estimates"]
    assert round(rank["step_time_ms"], 4) == chosen["step_time_ms"]
    assert rank["memory_per_rank"] == chosen["memory"]
    assert rank["layout"]["ep"] == chosen["parallelism"]["ep"]


def test_a_layout_no_pool_can_run_is_refused_with_the_reason() -> None:
    body = request_for({"gpus": 8, "dp": 1, "tp": 8})  # TP over 8 GPUs, nodes of 4
    with pytest.raises(planner.NoFeasiblePlanError) as info:
        json_documents.plan_request_json(wire.parse_plan_request(body), roofline_context())
    # What the operator's Estimated=False condition then says (`reconcile._fail_estimate`).
    said = estimator_client.describe_rejections(
        [{"gpu_type": t, "gpu_count": None, "reason": why} for t, why in info.value.rejections])
    assert "pinned layout: layout.tp: 8 GPUs cannot form TP groups inside nodes of 4" in said


@pytest.mark.parametrize(("layout", "problem"), [
    ({"dp": 2}, "spec.layout.gpus: required"),
    ({"gpus": 2, "dp": 2, "zeroStage": 5}, "spec.layout.zeroStage: must be one of"),
    ({"gpus": 2, "dp": 2, "fsdp": "zero"}, "spec.layout.fsdp: must be one of"),
    ({"gpus": 2, "dp": 2, "micro": 4}, "spec.layout.micro: unknown field"),
    ({"gpus": 2, "dp": 2, "checkpointFraction": 2}, "spec.layout.checkpointFraction: must be"),
    ({"gpus": 2, "dp": 2, "ep": 0}, "spec.layout.ep: must be"),
])
def test_a_malformed_layout_is_named_by_its_spec_field(layout: dict[str, Any], problem: str
                                                       ) -> None:
    with pytest.raises(errors.InvalidSpecError) as info:
        validation.parse_spec(spec_with(layout))
    assert any(p.startswith(problem) for p in info.value.errors), info.value.errors


def test_the_layout_choices_agree_everywhere() -> None:
    """One source per fact: the planner's choices (`parallel.named`), the service's request
    model, the CRD and the operator's validation list the same values."""
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]["layout"]["properties"]
    schema = layout_wire.LayoutBody.model_json_schema()["properties"]
    for crd_key, field, choices in [("fsdp", "fsdp", strategies.FSDP_MODES),
                                    ("checkpointing", "checkpointing", named.CHECKPOINTING),
                                    ("ppSchedule", "pp_schedule", named.PP_SCHEDULES)]:
        assert set(props[crd_key]["enum"]) == set(choices) == set(schema[field]["enum"])
        assert validation.LAYOUT_CHOICES[crd_key] == frozenset(choices)
        assert validation.LAYOUT_FIELDS[crd_key] == field
    assert set(props) == set(validation.LAYOUT_FIELDS)
    assert set(validation.LAYOUT_FIELDS.values()) == set(schema) - {"gpus_per_node"}
    assert set(props["zeroStage"]["enum"]) == set(strategies.ZERO_STAGES)
