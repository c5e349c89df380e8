"""Which few rows of a new GPU type make its probe: a spread over kernel sizes.

A probe (`fitting.with_probes`) corrects the transfer model on a GPU from a handful of its own
rows per kernel. What it must get right is the time of the kernels a model's step is made of,
and that time sits in the largest ones. `gpuplan bench` draws dims log-uniformly
(`benchmark-jobs/sweeps`), so its rows run from launch-bound microseconds to long GEMMs; the
shared op data is denser at small sizes, and 20 rows drawn from it at random were mostly
launch-bound: leaving one GPU out, such probes made whole-model error worse than the spec sheet
alone (21.1 -> 24.1 %, docs/latency-method.md). Evaluations therefore draw a probe the way the
bench spreads its rows: one row from each of `n` equal-count strata of the roofline time.
"""

from __future__ import annotations

from itertools import pairwise

import numpy as np
import numpy.typing as npt


def spread_pick(base_ms: npt.NDArray[np.float64], n: int, rng: np.random.Generator
                ) -> npt.NDArray[np.intp]:
    """Indices of `n` rows, one drawn at random from each of `n` equal-count strata of
    `base_ms` (all rows when there are no more than `n`), in stratum order."""
    if n < 1:
        raise ValueError(f"a probe needs at least one row, got n={n}")
    order = np.argsort(np.asarray(base_ms), kind="stable")
    if len(order) <= n:
        return order.astype(np.intp)
    edges = np.linspace(0, len(order), n + 1).astype(np.intp)
    return np.array([order[rng.integers(lo, hi)] for lo, hi in pairwise(edges)],
                    dtype=np.intp)
