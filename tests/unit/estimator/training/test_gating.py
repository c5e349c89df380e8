"""The promotion gate on hand-made manifests and outcomes: better, worse on one measure, equal."""

from __future__ import annotations

from typing import Any

import pytest

from gpuplan_estimator.training import gating


def manifest(rs: dict[str, float], loo: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Metrics shaped as `fitting.validate_kernel` writes them (100 held-out rows each)."""
    metrics: dict[str, Any] = {k: {"random_split": {"rows": 100.0, "mape_pct": v}}
                               for k, v in rs.items()}
    for kernel, devices in loo.items():
        metrics.setdefault(kernel, {})["leave_one_device_out"] = {
            d: {"rows": 100.0, "mape_pct": v} for d, v in devices.items()}
    return {"metrics": metrics}


ACTIVE = manifest({"gemm": 10.0, "softmax": 5.0},
                  {"gemm": {"t4": 30.0, "l4": 20.0}, "softmax": {"t4": 8.0}})


def test_a_better_candidate_is_promoted_and_says_on_what() -> None:
    better = manifest({"gemm": 9.0, "softmax": 4.0},
                      {"gemm": {"t4": 25.0, "l4": 20.0}, "softmax": {"t4": 7.0}})
    decision = gating.decide(better, ACTIVE)
    assert decision.promote
    assert decision.reason == ("no worse on leave-one-GPU-out MAPE, random-split MAPE "
                               "(4 checks)")
    gemm_loo = next(c for c in decision.checks
                    if c.measure == gating.LEAVE_ONE_GPU_OUT and c.scope == "gemm")
    assert (gemm_loo.candidate_pct, gemm_loo.active_pct) == (22.5, 25.0)  # row-weighted


def test_an_equal_candidate_is_promoted() -> None:
    assert gating.decide(ACTIVE, ACTIVE).promote


@pytest.mark.parametrize(("candidate", "named"), [
    (manifest({"gemm": 10.0, "softmax": 5.5},
              {"gemm": {"t4": 30.0, "l4": 20.0}, "softmax": {"t4": 8.0}}),
     "random-split MAPE of softmax: 5.50 % vs active 5.00 %"),
    (manifest({"gemm": 9.0, "softmax": 5.0},
              {"gemm": {"t4": 30.0, "l4": 24.0}, "softmax": {"t4": 8.0}}),
     "leave-one-GPU-out MAPE of gemm: 27.00 % vs active 25.00 %"),
    (manifest({"gemm": 9.0}, {"gemm": {"t4": 30.0, "l4": 20.0}}),
     "random-split MAPE of softmax: the candidate has none"),
])
def test_worse_on_one_measure_is_refused_naming_it(candidate: dict[str, Any], named: str
                                                   ) -> None:
    decision = gating.decide(candidate, ACTIVE)
    assert not decision.promote
    assert decision.reason.startswith(f"worse than the active bundle on {named}")


def test_the_tolerance_lets_split_noise_through_but_not_more() -> None:
    def softmax(value: float) -> dict[str, Any]:
        return manifest({"gemm": 10.0, "softmax": value}, {})

    within = 5.0 * gating.TOLERANCE_RATIO + gating.TOLERANCE_ABS_PCT
    assert gating.decide(softmax(within), ACTIVE).promote
    assert not gating.decide(softmax(within + 0.01), ACTIVE).promote


def test_leave_one_gpu_out_compares_only_the_gpus_both_left_out() -> None:
    # The candidate also left out a new GPU (with a poor score): not held against it.
    cand = manifest({"gemm": 10.0, "softmax": 5.0},
                    {"gemm": {"t4": 30.0, "l4": 20.0, "h100-sxm-80gb": 90.0},
                     "softmax": {"t4": 8.0}})
    assert gating.decide(cand, ACTIVE).promote


def test_job_outcomes_are_a_measure_when_both_bundles_were_scored() -> None:
    actual = [100.0, 200.0]
    worse = gating.OutcomeScores(actual, candidate_seconds=[150.0, 300.0],
                                 active_seconds=[110.0, 210.0])
    decision = gating.decide(ACTIVE, ACTIVE, outcomes=worse)
    assert not decision.promote
    assert "job-outcome MAPE of 2 finished jobs: 50.00 % vs active 7.50 %" in decision.reason
    better = gating.OutcomeScores(actual, candidate_seconds=[100.0, 200.0],
                                  active_seconds=[110.0, 210.0])
    assert gating.decide(ACTIVE, ACTIVE, outcomes=better).promote


def test_skipped_outcomes_and_a_first_bundle() -> None:
    decision = gating.decide(ACTIVE, None, outcomes_skipped="no scores")
    assert decision.promote and decision.reason == "no active bundle to compare with"
    assert decision.skipped == ("job-outcome MAPE: no scores",)
    nothing = gating.decide(ACTIVE, {"metrics": {}})
    assert not nothing.promote and "--force" in nothing.reason
    with pytest.raises(ValueError, match="same non-zero number"):
        gating.outcome_mape_pct([1.0], [])
