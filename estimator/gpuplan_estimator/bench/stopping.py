"""When a kernel family has been measured enough: its held-out error stopped improving.

After each batch of a family, a cheap roofline-shaped model, latency = t0 + a_op * FLOPs +
b_op * bytes with non-negative coefficients (a launch floor plus per-op compute and memory
rates), is fitted on the family's rows except every `holdout_every`-th by least squares on the
relative error, and scored on those held-out rows: the median absolute percentage error (the
median, because a few kernel-less rows, e.g. a transpose that is already contiguous, would own
a mean). The family stops once the best error of the last `patience`
batches is not `min_gain_pct` % better than the best error before them: more rows of the same
sampling distribution are not teaching a model of this shape anything, so the GPU minutes go to
the families still improving.

Everything here is a pure function on plain data, so the rule is tested without a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from gpuplan_estimator.core import errors


@dataclass(frozen=True)
class StopRule:
    """Parameters of the per-family stop rule."""

    holdout_every: int = 4
    """Every k-th row of a family is held out of the fit and scored."""
    patience: int = 4
    """Batches without enough improvement before the family stops."""
    min_gain_pct: float = 5.0
    """Relative improvement of the held-out error that counts as improving."""
    min_rows: int = 192
    """No decision before a family has this many rows: the cheap model's error levels off
    within ~100 rows on an H200, long before a learned model's does, so this floor is what
    each family gets at least (18 families x 192 rows is ~45 s of an H200)."""

    def validate(self) -> None:
        """Raise InvalidRequestError naming the field that is out of range."""
        if self.holdout_every < 2:
            raise errors.InvalidRequestError("holdout_every", f"must be >= 2, got "
                                             f"{self.holdout_every}")
        if self.patience < 1:
            raise errors.InvalidRequestError("patience", f"must be >= 1, got {self.patience}")
        if not 0.0 <= self.min_gain_pct < 100.0:
            raise errors.InvalidRequestError("min_gain_pct", f"must be in [0, 100), got "
                                             f"{self.min_gain_pct}")
        if self.min_rows < self.holdout_every:
            raise errors.InvalidRequestError(
                "min_rows", f"must be >= holdout_every ({self.holdout_every}), got {self.min_rows}")


@dataclass(frozen=True)
class FamilyRow:
    """What the stop rule knows of one measured row."""

    op: str
    flops: float
    bytes_moved: float
    latency_ms: float


def heldout_error_pct(rows: Sequence[FamilyRow], holdout_every: int) -> float | None:
    """Median APE (%) on every `holdout_every`-th row of a fit on the others; None if the fit
    would have no more rows than coefficients, or nothing is held out."""
    held = [r for i, r in enumerate(rows) if i % holdout_every == holdout_every - 1]
    fit = [r for i, r in enumerate(rows) if i % holdout_every != holdout_every - 1]
    ops = sorted({r.op for r in rows})
    if not held or len(fit) <= 1 + 2 * len(ops):
        return None
    x_fit, scale = _scaled(_design(fit, ops))
    y_fit = np.array([r.latency_ms for r in fit])
    # Rows divided by their latency: least squares on the relative error, as the stop rule
    # scores; non-negative rates keep a tiny held-out kernel from a negative prediction.
    coef, _ = nnls(x_fit / y_fit[:, None], np.ones(len(fit)))
    predicted = (_design(held, ops) / scale) @ coef
    actual = np.array([r.latency_ms for r in held])
    return float(100.0 * np.median(np.abs(predicted - actual) / actual))


def _design(rows: Sequence[FamilyRow], ops: Sequence[str]) -> np.ndarray:
    cols = [np.ones(len(rows))]
    cols += [np.array([r.flops if r.op == op else 0.0 for r in rows]) for op in ops]
    cols += [np.array([r.bytes_moved if r.op == op else 0.0 for r in rows]) for op in ops]
    return np.column_stack(cols)


def _scaled(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Columns divided by their largest value (FLOPs reach 1e12, the floor column is 1)."""
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    return x / scale, scale


def should_stop(errors_pct: Sequence[float | None], rows: int, rule: StopRule) -> bool:
    """True when the family's held-out error, one value per batch, stopped improving.

    `errors_pct` holds the held-out error after each batch (None while there were too few rows).
    """
    known = [e for e in errors_pct if e is not None and math.isfinite(e)]
    if rows < rule.min_rows or len(known) <= rule.patience:
        return False
    best_before = min(known[: -rule.patience])
    best_recent = min(known[-rule.patience:])
    return best_recent > best_before * (1.0 - rule.min_gain_pct / 100.0)

