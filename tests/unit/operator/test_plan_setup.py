"""How the plan runs (issue #19): the estimator's parallelism, memory strategy and memory by part
are read strictly, kept through status.plan under the CRD's schema, and handed to the trainer
as GPUPLAN_* variables."""

from __future__ import annotations

import asyncio
import base64
import copy
import dataclasses
import functools
import pathlib
from typing import Any

import pytest

from gpuplan_operator import estimator_client
from gpuplan_operator.core import errors, manifests, resources
from gpuplan_testing import crd_schema
from gpuplan_testing.operator_builders import LocalServer, make_plan

SETUP: dict[str, Any] = {
    "parallelism": {"dp": 2, "tp": 2, "pp": 1, "micro_batches": 2, "micro_batch": 8},
    "strategy": {"label": "zero-2 + accumulate x2 + checkpoint 50% of blocks", "zero_stage": 2,
                 "fsdp": "none", "checkpointing": "per-block", "checkpoint_fraction": 0.5,
                 "gradient_accumulation": 2, "offload_optimizer": False},
    "memory": {"parameters_bytes": 700, "gradients_bytes": 350, "optimizer_state_bytes": 1050,
               "activations_bytes": 4000, "workspace_bytes": 100,
               "framework_overhead_bytes": 500, "gathered_parameters_bytes": 0,
               "recompute_bytes": 40, "host_bytes": 0, "total_bytes": 6740},
}
BARE: dict[str, Any] = {"gpu_type": "NVIDIA-A100-SXM4-80GB", "gpu_count": 4, "gpus_per_node": 4,
                        "nodes": 1, "estimated_seconds": 3600.0, "step_time_ms": 120.5,
                        "memory_bytes_per_gpu": 6740}
PARALLELISM = resources.PlannedParallelism(dp=2, tp=2, pp=1, micro_batches=2, micro_batch=8,
                                           ep=1)
STRATEGY = resources.PlannedMemoryStrategy(
    label="zero-2 + accumulate x2 + checkpoint 50% of blocks", zero_stage=2, fsdp="none",
    checkpointing="per-block", checkpoint_fraction=0.5, gradient_accumulation=2,
    offload_optimizer=False)


def _parse(**plan: Any) -> resources.StatusPlan:
    return estimator_client.parse_plan({"plan": {**BARE, **plan}}, generation=1)


def _env(plan: resources.StatusPlan) -> dict[str, str]:
    job = manifests.build_job(owner=manifests.Owner("tj", "uid"), namespace="ns", plan=plan,
                              template={"spec": {"containers": [{"name": "trainer"}]}})
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_the_plans_setup_is_read() -> None:
    plan = _parse(**SETUP)
    assert plan.parallelism == PARALLELISM
    assert plan.strategy == STRATEGY
    assert plan.memory_bytes_by_part == SETUP["memory"]


def test_an_estimator_without_them_gives_none() -> None:
    plan = _parse()
    assert (plan.parallelism, plan.strategy, plan.memory_bytes_by_part) == (None, None, None)
    assert plan.setup_summary() == ""


@pytest.mark.parametrize(("section", "key", "value"), [
    ("parallelism", "dp", 2.0), ("parallelism", "tp", True), ("parallelism", "pp", 0),
    ("parallelism", "micro_batches", "2"), ("parallelism", "micro_batch", None),
    ("strategy", "label", 7), ("strategy", "label", ""), ("strategy", "zero_stage", 4),
    ("strategy", "zero_stage", -1), ("strategy", "fsdp", None), ("strategy", "checkpointing", 1),
    ("strategy", "checkpoint_fraction", 1.5), ("strategy", "checkpoint_fraction", True),
    ("strategy", "gradient_accumulation", 0), ("strategy", "offload_optimizer", "false"),
    ("memory", "host_bytes", -1), ("memory", "total_bytes", 1.5),
    ("memory", "Total", 1), ("memory", "part_2_bytes", 1),
])
def test_a_wrong_type_is_a_protocol_error_naming_the_field(section: str, key: str,
                                                            value: Any) -> None:
    setup = copy.deepcopy(SETUP)
    setup[section][key] = value
    with pytest.raises(errors.EstimatorProtocolError, match=key):
        _parse(**setup)


@pytest.mark.parametrize("section", ["parallelism", "strategy", "memory"])
def test_a_section_that_is_not_an_object_is_a_protocol_error(section: str) -> None:
    with pytest.raises(errors.EstimatorProtocolError, match=section):
        _parse(**{**SETUP, section: [1, 2]})


@pytest.mark.parametrize("key", ["dp", "micro_batch"])
def test_a_missing_parallelism_field_is_a_protocol_error(key: str) -> None:
    setup = copy.deepcopy(SETUP)
    del setup["parallelism"][key]
    with pytest.raises(errors.EstimatorProtocolError, match=key):
        _parse(**setup)


def test_a_layout_that_is_not_the_gpu_count_is_a_protocol_error() -> None:
    setup = copy.deepcopy(SETUP)
    setup["parallelism"]["dp"] = 4  # 4 x 2 x 1 = 8 GPUs in a 4-GPU plan
    with pytest.raises(errors.EstimatorProtocolError, match="gpu_count 4"):
        _parse(**setup)


def test_too_many_memory_parts_are_a_protocol_error() -> None:
    parts = {f"part_{'x' * (i + 1)}_bytes": 1 for i in range(resources.MAX_MEMORY_PARTS + 1)}
    with pytest.raises(errors.EstimatorProtocolError, match="at most"):
        _parse(**{**SETUP, "memory": parts})


def test_the_setup_round_trips_through_status_in_camel_case() -> None:
    plan = _parse(**SETUP)
    status = plan.to_status()
    assert status["parallelism"] == {"dp": 2, "tp": 2, "pp": 1, "microBatches": 2,
                                     "microBatch": 8, "ep": 1}
    assert status["memoryStrategy"] == {
        "label": STRATEGY.label, "zeroStage": 2, "fsdp": "none", "checkpointing": "per-block",
        "checkpointFraction": 0.5, "gradientAccumulation": 2, "offloadOptimizer": False}
    assert status["memoryBytesByPart"]["optimizerStateBytes"] == 1050
    assert status["memoryBytesByPart"]["hostBytes"] == 0
    assert resources.StatusPlan.from_status(status) == plan


def test_a_plan_stored_before_issue_19_reads_as_none() -> None:
    status = make_plan().to_status()
    assert not {"parallelism", "memoryStrategy", "memoryBytesByPart"} & set(status)
    plan = resources.StatusPlan.from_status(status)
    assert (plan.parallelism, plan.strategy, plan.memory_bytes_by_part) == (None, None, None)


@pytest.mark.parametrize("setup", [SETUP, {}], ids=["with-setup", "without"])
def test_status_plan_is_stored_unpruned_under_the_crd_schema(setup: dict[str, Any]) -> None:
    status = _parse(**setup).to_status()
    assert crd_schema.problems(status, crd_schema.status_plan_schema()) == []


def test_the_schema_check_sees_what_the_api_server_would_prune_or_refuse() -> None:
    """The check above can fail: unknown keys are pruned, bad values refused."""
    status = _parse(**SETUP).to_status()
    status["memoryStrategy"]["zeroStage"] = 4
    status["memoryStrategy"]["sharding"] = "full"
    status["parallelism"] = {"dp": 2}
    assert sorted(crd_schema.problems(status, crd_schema.status_plan_schema())) == [
        ".memoryStrategy.sharding: pruned", ".memoryStrategy.zeroStage: 4 breaks maximum 3",
        ".parallelism.microBatch: required", ".parallelism.microBatches: required",
        ".parallelism.pp: required", ".parallelism.tp: required"]


def test_every_schema_node_holds_only_openapi_keywords() -> None:
    """An unquoted comma in a flow-style description splits it into a stray key, which the API
    server refuses (the whole CRD); seen in this schema once."""
    assert crd_schema.unknown_keywords(crd_schema.trainingjob_schema()) == []
    assert crd_schema.unknown_keywords({"properties": {"x": {"type": "number", "b c": None}}}) == [
        ".properties.x.b c"]


def test_the_client_refuses_what_the_crd_would() -> None:
    """A plan the client accepts must be one the API server stores (else the status patch
    fails at every retry): the client's bounds are the CRD's."""
    props = crd_schema.status_plan_schema()["properties"]["memoryStrategy"]["properties"]
    assert props["zeroStage"]["maximum"] == estimator_client.MAX_ZERO_STAGE
    assert props["label"]["maxLength"] == estimator_client.MAX_LABEL_CHARS
    assert props["fsdp"]["maxLength"] == props["checkpointing"]["maxLength"] == (
        estimator_client.MAX_MODE_CHARS)
    parts = crd_schema.status_plan_schema()["properties"]["memoryBytesByPart"]
    assert parts["maxProperties"] == resources.MAX_MEMORY_PARTS


def test_the_printer_column_shows_the_strategy_in_wide_output() -> None:
    import yaml

    doc = yaml.safe_load(crd_schema.TRAININGJOB_CRD.read_text(encoding="utf-8"))
    (version,) = doc["spec"]["versions"]
    (column,) = [c for c in version["additionalPrinterColumns"] if c["name"] == "STRATEGY"]
    assert column["jsonPath"] == ".status.plan.memoryStrategy.label"
    assert column["priority"] == 1


def test_the_trainer_gets_the_setup_as_env() -> None:
    env = _env(_parse(**SETUP))
    assert {k: v for k, v in env.items() if k.startswith("GPUPLAN_")} == {
        "GPUPLAN_GPU_TYPE": "NVIDIA-A100-SXM4-80GB", "GPUPLAN_GPU_COUNT": "4",
        "GPUPLAN_ESTIMATED_SECONDS": "3600",
        "GPUPLAN_DATA_PARALLEL": "2", "GPUPLAN_TENSOR_PARALLEL": "2",
        "GPUPLAN_PIPELINE_PARALLEL": "1", "GPUPLAN_MICRO_BATCHES": "2",
        "GPUPLAN_MICRO_BATCH_SIZE": "8", "GPUPLAN_EXPERT_PARALLEL": "1",
        "GPUPLAN_GRADIENT_ACCUMULATION": "2",
        "GPUPLAN_ZERO_STAGE": "2", "GPUPLAN_FSDP": "none",
        "GPUPLAN_ACTIVATION_CHECKPOINTING": "per-block", "GPUPLAN_CHECKPOINT_FRACTION": "0.5",
        "GPUPLAN_OFFLOAD_OPTIMIZER": "false", "GPUPLAN_MEMORY_STRATEGY": STRATEGY.label}
    assert env["WORLD_SIZE"] == "4"


def test_without_a_setup_the_trainer_gets_only_the_older_variables() -> None:
    env = _env(_parse())
    assert {k for k in env if k.startswith("GPUPLAN_")} == {
        "GPUPLAN_GPU_TYPE", "GPUPLAN_GPU_COUNT", "GPUPLAN_ESTIMATED_SECONDS"}


def test_offload_and_fsdp_read_as_the_trainer_expects() -> None:
    strategy = dataclasses.replace(STRATEGY, label="fsdp hybrid + offload optimizer",
                                   zero_stage=0, fsdp="hybrid", checkpointing="none",
                                   checkpoint_fraction=None, gradient_accumulation=1,
                                   offload_optimizer=True)
    env = _env(dataclasses.replace(make_plan(), strategy=strategy))
    assert (env["GPUPLAN_FSDP"], env["GPUPLAN_OFFLOAD_OPTIMIZER"]) == ("hybrid", "true")
    assert "GPUPLAN_CHECKPOINT_FRACTION" not in env
    assert "GPUPLAN_DATA_PARALLEL" not in env  # the plan carries a strategy, no layout


@pytest.mark.parametrize(("parallelism", "strategy", "summary"), [
    (PARALLELISM, STRATEGY, "dp=2 tp=2 pp=1, zero-2 + accumulate x2 + checkpoint 50% of blocks"),
    (PARALLELISM, dataclasses.replace(STRATEGY, label="none"),
     "dp=2 tp=2 pp=1, no memory-saving strategy"),
    (None, None, ""),
])
def test_the_setup_summary(parallelism: resources.PlannedParallelism | None,
                           strategy: resources.PlannedMemoryStrategy | None, summary: str) -> None:
    plan = dataclasses.replace(make_plan(), parallelism=parallelism, strategy=strategy)
    assert plan.setup_summary() == summary


def test_the_real_estimators_strategy_reaches_the_trainer() -> None:
    """`gpuplan serve`'s app plans a batch one L4 holds only with accumulation; the operator
    reads it, stores it under the CRD's schema and hands it to the trainer."""
    import onnx

    from gpuplan_estimator.interfaces.http import service, work
    from gpuplan_testing.contexts import roofline_context

    light = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
    body = {"model_onnx_b64": base64.b64encode(
                (light / "light_resnet50.onnx").read_bytes()).decode(),
            "training": {"batch_size": 1024, "dataset_size": 10_240},
            "objective": {"max_gpus": 1},
            "inventory": [{"gpu_type": "NVIDIA-L4", "gpus_per_node": 4}]}
    app = service.make_app(service.ServiceState(functools.partial(
        work.given_context, roofline_context())), service.ServiceSettings(bundle_poll_s=3600))

    async def ask() -> resources.StatusPlan:
        async with LocalServer(app) as srv:
            return await estimator_client.request_plan(srv.url, body, generation=1,
                                                       timeout_seconds=60, tenant="t")

    plan = asyncio.run(ask())
    assert plan.parallelism is not None and plan.strategy is not None
    assert plan.strategy.gradient_accumulation > 1, plan.strategy
    assert plan.parallelism.micro_batches * plan.parallelism.micro_batch == 1024
    assert plan.memory_bytes_by_part is not None
    assert plan.memory_bytes_by_part["total_bytes"] == plan.memory_bytes_per_gpu
    status = plan.to_status()
    assert crd_schema.problems(status, crd_schema.status_plan_schema()) == []
    assert resources.StatusPlan.from_status(status) == plan
    env = _env(plan)
    assert env["GPUPLAN_GRADIENT_ACCUMULATION"] == str(plan.strategy.gradient_accumulation)
    assert env["GPUPLAN_MICRO_BATCH_SIZE"] == str(plan.parallelism.micro_batch)
    assert env["GPUPLAN_MEMORY_STRATEGY"] == plan.strategy.label
