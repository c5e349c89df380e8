"""MemoryStrategy validation, shard groups, micro-batches and the candidate order."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.parallel import strategies
from gpuplan_estimator.parallel.strategies import MemoryStrategy


@pytest.mark.parametrize(("kw", "field"), [
    ({"zero_stage": 4}, "zero_stage"),
    ({"zero_stage": True}, "zero_stage"),
    ({"fsdp": "partial"}, "fsdp"),
    ({"fsdp": "full", "zero_stage": 2}, "fsdp"),
    ({"checkpointing": "some"}, "checkpointing"),
    ({"checkpointing": "per-block"}, "checkpoint_fraction"),
    ({"checkpointing": "per-block", "checkpoint_fraction": 0.0}, "checkpoint_fraction"),
    ({"checkpointing": "per-block", "checkpoint_fraction": 1.5}, "checkpoint_fraction"),
    ({"checkpointing": "full", "checkpoint_fraction": 0.5}, "checkpoint_fraction"),
    ({"gradient_accumulation": 0}, "gradient_accumulation"),
    ({"gradient_accumulation": 2.0}, "gradient_accumulation"),
    ({"offload_optimizer": True}, "offload_optimizer"),
    ({"offload_optimizer": "yes", "zero_stage": 2}, "offload_optimizer"),
])
def test_invalid_strategies_name_the_field(kw: dict[str, Any], field: str) -> None:
    strategy = MemoryStrategy(**kw)
    assert [e.split(":")[0] for e in strategy.validate()] == [field]
    with pytest.raises(InvalidRequestError) as info:
        strategy.check()
    assert info.value.field == field


def test_every_error_is_reported_at_once() -> None:
    bad = MemoryStrategy(zero_stage=7, fsdp="x", gradient_accumulation=-1)
    assert [e.split(":")[0] for e in bad.validate()] == [
        "zero_stage", "fsdp", "gradient_accumulation"]
    with pytest.raises(InvalidRequestError) as info:
        bad.check()
    assert len(info.value.details) == 3


@pytest.mark.parametrize(("strategy", "params", "grads", "state"), [
    (MemoryStrategy(), False, False, False),
    (MemoryStrategy(zero_stage=1), False, False, True),
    (MemoryStrategy(zero_stage=2), False, True, True),
    (MemoryStrategy(zero_stage=3), True, True, True),
    (MemoryStrategy(fsdp="full"), True, True, True),
    (MemoryStrategy(fsdp="hybrid"), True, True, True),
])
def test_what_each_strategy_shards(strategy: MemoryStrategy, params: bool, grads: bool,
                                   state: bool) -> None:
    assert (strategy.shards_parameters, strategy.shards_gradients,
            strategy.shards_optimizer_state) == (params, grads, state)


@pytest.mark.parametrize(("strategy", "dp", "per_node", "tp", "group"), [
    (MemoryStrategy(), 16, 8, 1, 1),
    (MemoryStrategy(zero_stage=2), 16, 8, 1, 16),
    (MemoryStrategy(fsdp="full"), 16, 8, 1, 16),
    (MemoryStrategy(fsdp="hybrid"), 16, 8, 1, 8),
    (MemoryStrategy(fsdp="hybrid"), 4, 8, 2, 4),
    (MemoryStrategy(fsdp="hybrid"), 8, 8, 2, 4),
    (MemoryStrategy(fsdp="hybrid"), 3, 8, 1, 3),
])
def test_shard_group_size(strategy: MemoryStrategy, dp: int, per_node: int, tp: int,
                          group: int) -> None:
    assert strategies.shard_group_size(strategy, data_parallel=dp, gpus_per_node=per_node,
                                       tensor_parallel=tp) == group


def test_micro_batch_divides_exactly_or_refuses() -> None:
    assert strategies.micro_batch_size(32, MemoryStrategy(gradient_accumulation=4)) == 8
    with pytest.raises(InvalidRequestError) as info:
        strategies.micro_batch_size(30, MemoryStrategy(gradient_accumulation=4))
    assert info.value.field == "gradient_accumulation"


def test_labels() -> None:
    assert MemoryStrategy().label == "none"
    assert MemoryStrategy(zero_stage=2, gradient_accumulation=4, checkpointing="per-block",
                          checkpoint_fraction=0.5).label == (
        "zero-2 + accumulate x4 + checkpoint 50% of blocks")


def test_candidates_follow_the_documented_order() -> None:
    got = strategies.candidate_strategies(per_gpu_batch=16, data_parallel=16, gpus_per_node=8,
                                          max_accumulation=4)
    labels = [s.label for s in got]
    assert labels[:6] == ["none", "zero-1", "zero-2", "zero-2 + accumulate x2",
                          "zero-2 + accumulate x4", "zero-2 + checkpoint 50% of blocks"]
    first = {kind: next(i for i, s in enumerate(got) if pred(s)) for kind, pred in {
        "accumulate": lambda s: s.gradient_accumulation > 1,
        "checkpoint": lambda s: s.checkpointing != "none",
        "zero3": lambda s: s.shards_parameters,
        "offload": lambda s: s.offload_optimizer}.items()}
    assert first["accumulate"] < first["checkpoint"] < first["zero3"] < first["offload"]
    assert got[first["zero3"]].fsdp == "hybrid"  # two nodes: hybrid before full sharding
    assert len(set(got)) == len(got)
    for s in got:
        s.check()
        assert 16 % s.gradient_accumulation == 0


def test_one_gpu_candidates_never_shard_but_can_offload() -> None:
    got = strategies.candidate_strategies(per_gpu_batch=6, data_parallel=1, gpus_per_node=8)
    assert not any(s.shards_parameters for s in got)
    assert {s.gradient_accumulation for s in got} == {1, 2}  # 4 does not divide 6
    assert got[-1].offload_optimizer and got[-1].zero_stage == 2
