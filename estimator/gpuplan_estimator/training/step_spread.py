"""Fit how whole GPU steps scatter beyond their kernels' intervals (issue #30).

A step's P10-P90 (`planning.intervals`) is built from its kernels' spreads; measured whole
steps on an H200 fell inside it for 81 % of training steps but 61 % of inference forwards
(docs/gpu-steps/2026-11-27-h200b), because what composes kernels into a step (launch gaps,
the kernel a library picks for the shape, the host) errs beyond any one kernel. That error is
one more log-normal term per step kind and GEMM math (`intervals.widened`, `STEP_MATHS`: tf32
steps, priced partly from a profile fit, err more than fp32 ones), sized split-conformally: each
measured step needs the smallest extra sigma that puts it inside its interval
(`StepResidual.needed_log_sigma`), and the fit is the `COVERAGE` quantile of those needs, with
the finite-sample (n + 1) correction. `leave_one_group_out` sizes it without each model in
turn: the coverage those folds reach on the model they left out is the held-out figure.
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

    def needed_log_sigma(self) -> float:
        """The least extra log-sigma (`intervals.widened`) that puts the measurement inside
        the interval: 0 for one already inside."""
        low, high = self.interval_ms
        if low <= self.measured_ms <= high:
            return 0.0
        error = math.log(self.measured_ms / self.predicted_ms)
        edge = high if error > 0 else low
        held = abs(math.log(edge / self.predicted_ms)) if edge > 0 else math.inf
        return math.sqrt(max(error * error - held * held, 0.0)) / Z90

    def inside(self, log_sigma: float) -> bool:
        """Whether the measurement is inside the interval widened by `log_sigma`."""
        low, high = intervals.widened(self.interval_ms, self.predicted_ms, log_sigma)
        return low <= self.measured_ms <= high


def fit(rows: Sequence[StepResidual]) -> dict[str, dict[str, float]]:
    """Per step kind and math, the conformal `COVERAGE` quantile of the rows' needed
    log-sigma.

    ValueError naming a kind and math without a row: a bundle's entry must hold every one."""
    out: dict[str, dict[str, float]] = {}
    for kind in intervals.STEP_KINDS:
        out[kind] = {}
        for math_name in intervals.STEP_MATHS:
            needs = sorted(r.needed_log_sigma() for r in rows
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
    widened by their group's fold (`leave_one_group_out`): how often a model never fitted on
    lands inside."""
    cells: dict[str, list[bool]] = {}
    for r in rows:
        inside = r.inside(folds[r.group][r.kind][r.math])
        cells.setdefault(r.kind, []).append(inside)
        cells.setdefault(f"{r.kind}/{r.math}", []).append(inside)
    return {cell: sum(hits) / len(hits) for cell, hits in sorted(cells.items())}
