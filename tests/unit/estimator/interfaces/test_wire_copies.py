"""The wire models that mirror domain types are tested against them (one source per fact)."""

from __future__ import annotations

import dataclasses

from gpuplan_estimator.interfaces.http import responses
from gpuplan_estimator.parallel.sharding import ShardedMemory
from gpuplan_estimator.parallel.strategies import MemoryStrategy
from gpuplan_estimator.step.memory import MemoryBreakdown


def test_the_strategy_memory_model_has_every_part_the_planner_reports() -> None:
    breakdown = MemoryBreakdown(1, 2, 3, 4, 5, 6, per_gpu_batch=1, data_parallel=1)
    parts = {f.name: 1 for f in dataclasses.fields(ShardedMemory)
             if f.name not in ("micro_batch", "strategy")}
    reported = ShardedMemory(**parts, micro_batch=1, strategy=MemoryStrategy()).as_dict()
    assert set(responses.StrategyMemory.model_fields) == set(reported)
    assert set(breakdown.as_dict()) <= set(reported)


def test_the_strategy_model_has_every_field_of_the_domain_type() -> None:
    fields = {f.name for f in dataclasses.fields(MemoryStrategy)}
    assert set(responses.Strategy.model_fields) == fields | {"label"}
