"""The step-level spread (`training.step_spread`): the least spread each measured step needs
(an extra sigma, or a shrink of an interval wider than it), its conformal quantile per kind,
and held-out coverage from leave-one-model-out folds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuplan_estimator.core.quantiles import Z90
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.training.step_spread import (
    StepResidual,
    fit,
    held_out_coverage,
    leave_one_group_out,
)


def _row(measured_ms: float, *, group: str = "m", kind: str = "train", math_name: str = "tf32",
         interval_ms: tuple[float, float] = (90.0, 110.0)) -> StepResidual:
    return StepResidual(group, kind, math_name, measured_ms, 100.0, interval_ms)


def _everywhere(*rows: StepResidual) -> list[StepResidual]:
    """`rows` and their copies in every kind and math (a fit needs all of them)."""
    return [StepResidual(r.group, kind, m, r.measured_ms, r.predicted_ms, r.interval_ms)
            for r in rows for kind in intervals.STEP_KINDS for m in intervals.STEP_MATHS]


def test_a_step_needs_just_enough_sigma_to_land_on_its_interval_edge() -> None:
    high = _row(150.0)
    need = high.needed_spread()
    assert need == pytest.approx(math.sqrt(math.log(1.5) ** 2 - math.log(1.1) ** 2) / Z90)
    assert high.inside(need * 1.0001) and not high.inside(need * 0.999)
    low = _row(60.0)
    assert low.inside(low.needed_spread() * 1.0001)
    assert not low.inside(low.needed_spread() * 0.999)


def test_a_step_inside_needs_a_shrink_that_lands_it_on_the_edge() -> None:
    inside = _row(105.0)
    need = inside.needed_spread()
    assert need == pytest.approx(math.log(math.log(1.05) / math.log(1.1)))
    assert need < 0
    assert inside.inside(need + 1e-4) and not inside.inside(need - 1e-4)
    below = _row(95.0)
    assert below.needed_spread() == pytest.approx(math.log(math.log(100 / 95) / math.log(100 / 90)))
    # Spot on: any shrink holds it, down to the narrowest a spread may make an interval.
    assert _row(100.0).needed_spread() == intervals.MIN_STEP_SPREAD
    assert _row(100.0).inside(intervals.MIN_STEP_SPREAD)


def test_the_fit_is_the_corrected_eighty_percent_quantile_per_kind_and_math() -> None:
    rng = np.random.default_rng(0)
    scales = {"fp32": 0.2, "tf32": 0.5, "half": 0.03}  # half: inside an interval too wide
    rows = [_row(float(100 * math.exp(e)), kind=kind, math_name=m)
            for kind in intervals.STEP_KINDS for m, scale in scales.items()
            for e in rng.normal(0, scale, 200)]
    sigma = fit(rows)
    for kind in intervals.STEP_KINDS:
        assert sigma[kind]["tf32"] > 2 * sigma[kind]["fp32"] > 0 > sigma[kind]["half"]
        for m in intervals.STEP_MATHS:
            mine = [r for r in rows if (r.kind, r.math) == (kind, m)]
            inside = sum(r.inside(sigma[kind][m]) for r in mine) / len(mine)
            assert 0.8 <= inside <= 0.82  # ceil(201 * 0.8) = 161 of 200 rows
    on_the_edge = fit(_everywhere(_row(110.0)))
    assert on_the_edge == intervals.no_step_sigma()


def test_every_kind_and_math_needs_a_row() -> None:
    rows = [r for r in _everywhere(_row(150.0)) if (r.kind, r.math) != ("inference", "half")]
    with pytest.raises(ValueError, match="no measured inference step in half math"):
        fit(rows)


def test_folds_leave_their_own_model_out() -> None:
    rows = [r for g, m in (("tight", 101.0), ("loose", 200.0))
            for r in _everywhere(*[_row(m, group=g)] * 5)]
    folds = leave_one_group_out(rows)
    # sized on "tight" alone, a step 1 % off inside +-10 %: its interval shrinks
    assert folds["loose"]["train"]["fp32"] == pytest.approx(_row(101.0).needed_spread(), abs=1e-5)
    assert folds["loose"]["train"]["fp32"] < 0
    assert folds["tight"]["train"]["fp32"] == pytest.approx(_row(200.0).needed_spread(),
                                                            rel=1e-4)
    # The loose model was never inside its own fold; the tight one always is.
    coverage = held_out_coverage(rows, folds)
    assert coverage["train"] == coverage["inference"] == coverage["inference/tf32"] == 0.5
