"""Planner: candidates, rejections with reasons, objectives."""

import dataclasses
import math

import pytest

from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.planning import calibrating, placement

GIB = 2**30


def point(batch: int, fwd: float, bwd: float, mem_gib: float, opt: float = 1.0):
    return placement.StepPoint(
        per_gpu_batch=batch, forward_ms=fwd, backward_ms=bwd, optimizer_ms=opt,
        memory_bytes=int(mem_gib * GIB),
        p10_ms=0.9 * (fwd + bwd + opt),
        p90_ms=1.1 * (fwd + bwd + opt),
    )


def profile(key: str, *, cap_gib: float, price: float, points, grad_bytes: int = 100 * 2**20):
    return placement.StepProfile(
        device_key=key, memory_capacity_bytes=int(cap_gib * GIB), gradient_bytes=grad_bytes,
        price_per_gpu_hour_usd=price, interconnect_gbps=600.0, points=tuple(points),
    )


FAST = profile("fast", cap_gib=80, price=4.0,
               points=[point(4, 10, 20, 10), point(64, 100, 200, 40)])
SLOW = profile("slow", cap_gib=24, price=1.0,
               points=[point(4, 40, 80, 10), point(64, 400, 800, 40)])
POOLS = [
    placement.GpuPool("FAST-GPU", "fast", gpus_per_node=8, nodes=2, free_gpus=16),
    placement.GpuPool("SLOW-GPU", "slow", gpus_per_node=4, nodes=4, free_gpus=16),
]
SHAPE = placement.TrainingShape(global_batch=64, steps_per_epoch=1000, epochs=1)
NO_COMM = ScalingModel(overlap=1.0)


def test_interpolates_linearly_between_points() -> None:
    p = FAST.at(34)
    assert p.forward_ms == pytest.approx(10 + (100 - 10) * 30 / 60)
    assert p.memory_bytes == pytest.approx(25 * GIB, rel=1e-6)


def test_candidate_counts_take_whole_nodes_beyond_one() -> None:
    assert placement.candidate_counts(24, 8) == [1, 2, 3, 4, 5, 6, 7, 8, 16, 24]
    assert placement.candidate_counts(3, 8) == [1, 2, 3]


def test_memory_rejection_names_sizes() -> None:
    out = placement.evaluate(SLOW, POOLS[1], SHAPE, 1, NO_COMM)
    assert isinstance(out, placement.Rejection)
    assert "40.0 GiB" in out.reason and "24.0 GiB" in out.reason


def test_cheapest_meets_deadline_and_fastest_is_faster() -> None:
    obj = placement.Objective(prefer="cheapest", max_gpus=16, deadline_seconds=600)
    cheap = placement.plan({"fast": FAST, "slow": SLOW}, POOLS, SHAPE, obj, NO_COMM)
    assert cheap.chosen is not None
    assert cheap.chosen.estimated_seconds <= 600
    assert all(c.cost_usd >= cheap.chosen.cost_usd for c in cheap.candidates)
    fastest = placement.plan(
        {"fast": FAST, "slow": SLOW}, POOLS, SHAPE,
        placement.Objective(prefer="fastest", max_gpus=16), NO_COMM,
    )
    assert fastest.chosen is not None
    assert fastest.chosen.estimated_seconds <= cheap.chosen.estimated_seconds
    assert any("deadline" in r.reason for r in cheap.rejected)


def test_no_feasible_plan_keeps_reason_per_type() -> None:
    obj = placement.Objective(prefer="cheapest", max_gpus=1, deadline_seconds=1)
    out = placement.plan({"fast": FAST, "slow": SLOW}, POOLS, SHAPE, obj, NO_COMM)
    assert out.chosen is None
    assert set(out.reasons_by_type) == {"FAST-GPU", "SLOW-GPU"}


def test_missing_profile_is_a_reason_not_a_crash() -> None:
    out = placement.plan({"fast": FAST}, POOLS, SHAPE, placement.Objective(max_gpus=2), NO_COMM)
    assert "no estimate" in out.reasons_by_type["SLOW-GPU"]


def test_budget_rejects_expensive_candidates() -> None:
    obj = placement.Objective(prefer="fastest", max_gpus=16, budget_usd=0.5)
    out = placement.plan({"fast": FAST, "slow": SLOW}, POOLS, SHAPE, obj, NO_COMM)
    assert all(c.cost_usd <= 0.5 for c in out.candidates)
    assert any("budget" in r.reason for r in out.rejected)


def test_cluster_size_limits_counts() -> None:
    pools = [placement.GpuPool("FAST-GPU", "fast", gpus_per_node=8, nodes=1, free_gpus=8)]
    out = placement.plan({"fast": FAST}, pools, SHAPE, placement.Objective(max_gpus=16), NO_COMM)
    assert max(c.gpu_count for c in out.candidates) == 8
    assert any("only 8 GPUs" in r.reason for r in out.rejected)


def test_unknown_objective_is_an_error_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"objective\.prefer"):
        placement.plan({}, [], SHAPE, placement.Objective(prefer="quickest"), NO_COMM)


def test_cost_is_gpu_hours_times_price() -> None:
    out = placement.evaluate(FAST, POOLS[0], SHAPE, 2, NO_COMM)
    assert isinstance(out, placement.PlacementCandidate)
    assert out.cost_usd == pytest.approx(out.estimated_seconds / 3600 * 2 * 4.0)
    assert out.per_gpu_batch == math.ceil(64 / 2)
    assert (out.gpus_per_node, out.nodes) == (2, 1)
    multi = placement.evaluate(FAST, POOLS[0], SHAPE, 16, NO_COMM)
    assert isinstance(multi, placement.PlacementCandidate)
    assert (multi.gpus_per_node, multi.nodes) == (8, 2)


def test_calibration_scales_the_all_reduce_too_and_is_carried_to_the_candidate() -> None:
    """Points arrive calibrated; the network part follows, so the whole step is × factor."""
    factor = 1.5
    correction = calibrating.Correction(factor, 0.1, 4, "device+mode")
    scaled = profile("fast", cap_gib=80, price=4.0, points=[
        dataclasses.replace(p, forward_ms=p.forward_ms * factor,
                            backward_ms=p.backward_ms * factor,
                            optimizer_ms=p.optimizer_ms * factor,
                            p10_ms=p.p10_ms * factor, p90_ms=p.p90_ms * factor)
        for p in FAST.points])
    scaled = dataclasses.replace(scaled, calibration=correction)
    for n in (1, 8, 16):  # one GPU, one node, two nodes (all-reduce exposed past the overlap)
        raw = placement.evaluate(FAST, POOLS[0], SHAPE, n, ScalingModel(overlap=0.0))
        cal = placement.evaluate(scaled, POOLS[0], SHAPE, n, ScalingModel(overlap=0.0))
        assert isinstance(raw, placement.PlacementCandidate)
        assert isinstance(cal, placement.PlacementCandidate)
        assert raw.calibration == calibrating.IDENTITY and cal.calibration == correction
        assert cal.allreduce_ms == pytest.approx(raw.allreduce_ms * factor)
        assert cal.step_time_ms == pytest.approx(raw.step_time_ms * factor)
        assert cal.estimated_seconds == pytest.approx(raw.estimated_seconds * factor)
        assert cal.interval_seconds == pytest.approx(
            (raw.interval_seconds[0] * factor, raw.interval_seconds[1] * factor))
