"""The step-level spread (`training.step_spread`): the least extra sigma each measured step
needs, its conformal quantile per kind, and held-out coverage from leave-one-model-out folds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gpuplan_estimator.core.quantiles import Z90
from gpuplan_estimator.training.step_spread import (
    StepResidual,
    fit,
    held_out_coverage,
    leave_one_group_out,
)


def _row(measured_ms: float, *, group: str = "m", kind: str = "train",
         interval_ms: tuple[float, float] = (90.0, 110.0)) -> StepResidual:
    return StepResidual(group, kind, measured_ms, 100.0, interval_ms)


def test_a_step_needs_just_enough_sigma_to_land_on_its_interval_edge() -> None:
    assert _row(105.0).needed_log_sigma() == 0.0
    high = _row(150.0)
    need = high.needed_log_sigma()
    assert need == pytest.approx(math.sqrt(math.log(1.5) ** 2 - math.log(1.1) ** 2) / Z90)
    assert high.inside(need * 1.0001) and not high.inside(need * 0.999)
    low = _row(60.0)
    assert low.inside(low.needed_log_sigma() * 1.0001)
    assert not low.inside(low.needed_log_sigma() * 0.999)


def test_the_fit_is_the_corrected_eighty_percent_quantile_per_kind() -> None:
    rng = np.random.default_rng(0)
    rows = [_row(float(100 * math.exp(e)), kind=kind)
            for kind, scale in (("train", 0.1), ("inference", 0.3))
            for e in rng.normal(0, scale, 200)]
    sigma = fit(rows)
    assert sigma["inference"] > 2 * sigma["train"] > 0
    for kind in ("train", "inference"):
        mine = [r for r in rows if r.kind == kind]
        inside = sum(r.inside(sigma[kind]) for r in mine) / len(mine)
        assert 0.8 <= inside <= 0.82  # ceil(201 * 0.8) = 161 of 200 rows
    assert fit([_row(100.0), _row(100.0, kind="inference")]) == {"train": 0.0,
                                                                  "inference": 0.0}


def test_every_kind_needs_a_row() -> None:
    with pytest.raises(ValueError, match="no measured inference step"):
        fit([_row(150.0)])


def test_folds_leave_their_own_model_out() -> None:
    rows = [_row(m, group=g, kind=k) for g, m in (("tight", 101.0), ("loose", 200.0))
            for k in ("train", "inference") for _ in range(5)]
    folds = leave_one_group_out(rows)
    assert folds["loose"] == {"train": 0.0, "inference": 0.0}  # sized on "tight" alone
    assert folds["tight"]["train"] == pytest.approx(_row(200.0).needed_log_sigma(), rel=1e-4)
    # The loose model was never inside its own fold; the tight one always is.
    assert held_out_coverage(rows, folds) == {"train": 0.5, "inference": 0.5}
