"""Time costs of strategies: recompute, micro-steps, collectives' bytes, offload."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.parallel import strategy_time
from gpuplan_estimator.parallel.strategies import MemoryStrategy
from gpuplan_estimator.parallel.strategy_time import Collective, StepSplit
from gpuplan_estimator.step.decomposition import TrainingSettings

SPLIT = StepSplit(forward_ms=10.0, backward_ms=20.0, optimizer_ms=4.0)
P = 1_000_000


def cost(strategy: MemoryStrategy, **kw: Any) -> strategy_time.StrategyTime:
    args: dict[str, Any] = {"settings": TrainingSettings(batch_size=8, optimizer="adam",
                                                         precision="bf16"),
                            "parameter_count": P, "data_parallel": 8, "gpus_per_node": 8} | kw
    return strategy_time.time_overheads(SPLIT, strategy, **args)


def volume(c: strategy_time.StrategyTime) -> int:
    """Bytes each rank sends, in units where an all-reduce of X sends 2X (ring)."""
    factor = {"all-reduce": 2, "reduce-scatter": 1, "all-gather": 1}
    return sum(factor[x.kind] * x.payload_bytes * x.count for x in c.collectives)


def test_plain_data_parallel_all_reduces_gradients_once() -> None:
    c = cost(MemoryStrategy())
    assert c.collectives == (Collective("all-reduce", 2 * P, 8, 1, "gradients"),)
    assert c.compute_ms == pytest.approx(34.0)


def test_accumulation_runs_micro_steps_and_reduces_once_per_step() -> None:
    c = cost(MemoryStrategy(gradient_accumulation=4))
    assert (c.micro_steps, c.forward_ms, c.backward_ms, c.optimizer_ms) == (4, 40.0, 80.0, 4.0)
    assert [x.count for x in c.collectives] == [1]


@pytest.mark.parametrize(("strategy", "recompute_ms"), [
    (MemoryStrategy(checkpointing="full"), 10.0),
    (MemoryStrategy(checkpointing="per-block", checkpoint_fraction=0.25), 2.5),
    (MemoryStrategy(checkpointing="full", gradient_accumulation=2), 20.0),
])
def test_checkpointing_recomputes_forward(strategy: MemoryStrategy, recompute_ms: float) -> None:
    assert cost(strategy).recompute_ms == pytest.approx(recompute_ms)


@pytest.mark.parametrize("stage", [1, 2])
def test_zero_1_2_move_an_all_reduce_and_shard_the_optimizer(stage: int) -> None:
    c = cost(MemoryStrategy(zero_stage=stage))
    assert volume(c) == volume(cost(MemoryStrategy()))
    assert c.optimizer_ms == pytest.approx(4.0 / 8)


def test_zero3_moves_one_and_a_half_all_reduces() -> None:
    for strategy in (MemoryStrategy(zero_stage=3), MemoryStrategy(fsdp="full")):
        c = cost(strategy)
        assert volume(c) == 1.5 * volume(cost(MemoryStrategy()))
        assert {(x.kind, x.count) for x in c.collectives} == {("all-gather", 2),
                                                              ("reduce-scatter", 1)}


def test_zero2_and_zero3_reduce_every_micro_step() -> None:
    assert [x.count for x in cost(MemoryStrategy(zero_stage=2, gradient_accumulation=4))
            .collectives] == [4, 1]
    assert [x.count for x in cost(MemoryStrategy(zero_stage=3, gradient_accumulation=4))
            .collectives] == [8, 4]


def test_hybrid_shards_in_a_node_and_all_reduces_shards_across_nodes() -> None:
    c = cost(MemoryStrategy(fsdp="hybrid"), data_parallel=32, gpus_per_node=8)
    assert {(x.kind, x.group_size, x.payload_bytes) for x in c.collectives} == {
        ("all-gather", 8, 2 * P), ("reduce-scatter", 8, 2 * P), ("all-reduce", 4, 2 * P // 8)}


def test_tensor_and_pipeline_parallel_shrink_the_bytes() -> None:
    c = cost(MemoryStrategy(), tensor_parallel=2, pipeline_parallel=2)
    assert c.collectives[0].payload_bytes == 2 * P // 4


def test_one_replica_has_no_collectives() -> None:
    assert cost(MemoryStrategy(zero_stage=3), data_parallel=1).collectives == ()


def test_offload_prices_pcie_and_the_cpu_optimizer() -> None:
    host = strategy_time.HostLink(pcie_gbps=10.0, memory_bandwidth_gbps=50.0)
    c = cost(MemoryStrategy(zero_stage=2, offload_optimizer=True), host=host)
    shard = P // 8
    assert c.optimizer_ms == 0.0
    assert c.pcie_bytes == shard * (2 + 2)  # bf16 gradients down, bf16 parameters up
    assert c.pcie_ms == pytest.approx(shard * 4 / 10e9 * 1e3)
    touched = 18  # adam's reads+writes per element (decomposition.OPTIMIZER_PASSES)
    assert c.host_optimizer_ms == pytest.approx(shard * touched * 4 / 50e9 * 1e3)


@pytest.mark.parametrize(("kw", "field"), [
    ({"parameter_count": -1}, "parameter_count"),
    ({"data_parallel": 0}, "data_parallel"),
])
def test_bad_arguments_name_their_field(kw: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidRequestError) as info:
        cost(MemoryStrategy(), **kw)
    assert info.value.field == field


def test_negative_time_is_refused() -> None:
    with pytest.raises(InvalidRequestError) as info:
        strategy_time.time_overheads(
            StepSplit(forward_ms=-1.0, backward_ms=0.0, optimizer_ms=0.0), MemoryStrategy(),
            settings=TrainingSettings(batch_size=8), parameter_count=1, data_parallel=1,
            gpus_per_node=1)
    assert info.value.field == "forward_ms"
