"""The spread a probe's rows are drawn with (pure)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplan_estimator.training import probes


def test_one_row_from_each_equal_count_stratum_of_sizes() -> None:
    base = np.random.default_rng(1).lognormal(-3.0, 1.5, 1000)  # mostly launch-bound rows
    picked = probes.spread_pick(base, 20, np.random.default_rng(0))
    ranks = np.argsort(np.argsort(base))[picked]
    assert sorted(ranks // 50) == list(range(20))  # exactly one per twentieth of the sizes
    assert len(set(picked)) == 20


def test_the_pick_depends_only_on_the_generator() -> None:
    base = np.linspace(0.01, 10.0, 300)
    first = probes.spread_pick(base, 20, np.random.default_rng(3))
    np.testing.assert_array_equal(first, probes.spread_pick(base, 20, np.random.default_rng(3)))
    assert set(first) != set(probes.spread_pick(base, 20, np.random.default_rng(4)))


def test_few_rows_are_all_taken_and_an_empty_probe_is_refused() -> None:
    assert sorted(probes.spread_pick(np.array([3.0, 1.0, 2.0]), 20,
                                     np.random.default_rng(0))) == [0, 1, 2]
    with pytest.raises(ValueError, match="at least one row"):
        probes.spread_pick(np.array([1.0]), 0, np.random.default_rng(0))
