"""Fit how whole GPU steps scatter beyond, or within, their kernels' intervals (issue #30).

A step's P10-P90 (`planning.intervals`) is built from its kernels' spreads; measured whole
steps on an H200 fell inside it for 81 % of training steps but 61 % of inference forwards
(docs/gpu-steps/2026-11-27-h200b), because what composes kernels into a step (launch gaps,
the kernel a library picks for the shape, the host) errs beyond any one kernel; and bf16 steps,
whose kernel spreads were sized on other GPUs' rows, fell inside 95 %. One spread per step kind
and GEMM math (`intervals.STEP_MATHS`) corrects both (`intervals.with_step_spread`): >= 0, one
more log-normal term added in quadrature; < 0, the log of the factor the interval shrinks by.
It is sized split-conformally: each measured step's conformity score
(`StepResidual.needed_spread`) is the least spread that puts it inside its interval, and the
fit is the `COVERAGE` quantile of the scores, with the finite-sample (n + 1) correction.
`leave_one_group_out` sizes it without each model in turn: the coverage those folds reach on
the model they left out is the held-out figure.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuplan_estimator.core.quantiles import Z90
from gpuplan_estimator.planning import intervals

COVERAGE = 0.8
"""The interval is a P10-P90: four in five measured steps belong inside it."""


@dataclass(frozen=True)
class StepResidual:
    """One measured step against its estimate made without it (a held-out prediction)."""

    group: str  # the model: what leave-one-out leaves out
    kind: str  # intervals.STEP_KINDS
    math: str  # intervals.STEP_MATHS
    measured_ms: float
    predicted_ms: float
    interval_ms: tuple[float, float]

    def needed_spread(self) -> float:
        """The least spread (`intervals.with_step_spread`) that puts the measurement inside
        its interval: for one outside, the extra log-sigma that reaches it; for one inside, the
        log of the factor the interval could shrink by and still hold it (at least
        `intervals.MIN_STEP_SPREAD`). Larger spreads hold it too: the score of a conformal
        fit."""
        error = math.log(self.measured_ms / self.predicted_ms)
        low, high = self.interval_ms
        edge = high if error > 0 else low
        held = abs(math.log(edge / self.predicted_ms)) if edge > 0 else math.inf
        if abs(error) > held:
            return math.sqrt(error * error - held * held) / Z90
        if error == 0.0:
            return intervals.MIN_STEP_SPREAD
        return max(math.log(abs(error) / held), intervals.MIN_STEP_SPREAD)

    def inside(self, spread: float) -> bool:
        """Whether the measurement is inside the interval under `spread`."""
        low, high = intervals.with_step_spread(self.interval_ms, self.predicted_ms, spread)
        return low <= self.measured_ms <= high


def fit(rows: Sequence[StepResidual]) -> dict[str, dict[str, float]]:
    """Per step kind and math, the conformal `COVERAGE` quantile of the rows' needed
    spreads (`StepResidual.needed_spread`).

    ValueError naming a kind and math without a row: a bundle's entry must hold every one."""
    out: dict[str, dict[str, float]] = {}
    for kind in intervals.STEP_KINDS:
        out[kind] = {}
        for math_name in intervals.STEP_MATHS:
            needs = sorted(r.needed_spread() for r in rows
                           if (r.kind, r.math) == (kind, math_name))
            if not needs:
                raise ValueError(f"no measured {kind} step in {math_name} math to size the "
                                 "step spread on")
            rank = min(len(needs), math.ceil((len(needs) + 1) * COVERAGE))
            out[kind][math_name] = round(needs[rank - 1], 5)
    return out


def leave_one_group_out(rows: Sequence[StepResidual]) -> dict[str, dict[str, dict[str, float]]]:
    """Per group, the fit on every other group's rows."""
    return {group: fit([r for r in rows if r.group != group])
            for group in sorted({r.group for r in rows})}


def held_out_coverage(rows: Sequence[StepResidual],
                      folds: Mapping[str, intervals.StepSigma]) -> dict[str, float]:
    """Per step kind, and per "kind/math", the fraction of rows inside their interval
    under their group's fold (`leave_one_group_out`): how often a model never fitted on
    lands inside."""
    cells: dict[str, list[bool]] = {}
    for r in rows:
        inside = r.inside(folds[r.group][r.kind][r.math])
        cells.setdefault(r.kind, []).append(inside)
        cells.setdefault(f"{r.kind}/{r.math}", []).append(inside)
    return {cell: sum(hits) / len(hits) for cell, hits in sorted(cells.items())}
