"""Issue #30 part 7: a family stops once its held-out error stops improving."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplan_estimator.bench import stopping
from gpuplan_estimator.core import errors

RULE = stopping.StopRule(holdout_every=4, patience=3, min_gain_pct=5.0, min_rows=8)


def roofline_rows(n: int, noise: float = 0.0, seed: int = 0) -> list[stopping.FamilyRow]:
    rng = np.random.default_rng(seed)
    rows = []
    for _ in range(n):
        flops, nbytes = 10 ** rng.uniform(3, 11), 10 ** rng.uniform(3, 9)
        latency = 0.002 + flops / 5e11 + nbytes / 3e9  # launch floor + compute + memory (ms)
        rows.append(stopping.FamilyRow("op", flops, nbytes,
                                       latency * float(np.exp(rng.normal(0, noise)))))
    return rows


def test_heldout_error_of_a_roofline_family_is_near_zero() -> None:
    err = stopping.heldout_error_pct(roofline_rows(40), holdout_every=4)
    assert err is not None and err < 1.0


def test_heldout_error_grows_with_noise() -> None:
    clean = stopping.heldout_error_pct(roofline_rows(80, noise=0.05), 4)
    noisy = stopping.heldout_error_pct(roofline_rows(80, noise=0.5), 4)
    assert clean is not None and noisy is not None and noisy > 3 * clean


def test_heldout_error_needs_more_rows_than_coefficients() -> None:
    assert stopping.heldout_error_pct(roofline_rows(3), 4) is None
    two_ops = [stopping.FamilyRow(op, r.flops, r.bytes_moved, r.latency_ms)
               for op, r in zip(["a", "b"] * 3, roofline_rows(6), strict=True)]
    assert stopping.heldout_error_pct(two_ops, 4) is None  # 5 fit rows, 5 coefficients


def test_an_improving_family_continues() -> None:
    assert not stopping.should_stop([50.0, 40.0, 30.0, 25.0, 20.0], rows=100, rule=RULE)


def test_a_plateau_stops_the_family() -> None:
    assert stopping.should_stop([50.0, 30.0, 30.5, 29.9, 31.0], rows=100, rule=RULE)


def test_a_small_gain_is_not_improving() -> None:
    # 30 -> 29: 3.3 % better, below the 5 % that counts.
    assert stopping.should_stop([30.0, 29.5, 29.0, 29.2], rows=100, rule=RULE)


def test_no_decision_before_min_rows_or_enough_batches() -> None:
    plateau = [30.0, 30.0, 30.0, 30.0, 30.0]
    assert not stopping.should_stop(plateau, rows=7, rule=RULE)
    assert not stopping.should_stop(plateau[:3], rows=100, rule=RULE)
    assert not stopping.should_stop([None, None, 30.0, 30.0, 30.0], rows=100, rule=RULE)


@pytest.mark.parametrize(("field", "kw"), [("holdout_every", {"holdout_every": 1}),
                                           ("patience", {"patience": 0}),
                                           ("min_gain_pct", {"min_gain_pct": 100.0}),
                                           ("min_rows", {"min_rows": 2})])
def test_bad_rules_name_their_field(field: str, kw: dict[str, float]) -> None:
    with pytest.raises(errors.InvalidRequestError) as info:
        stopping.StopRule(**kw).validate()  # type: ignore[arg-type]
    assert info.value.field == field
