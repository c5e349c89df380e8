"""Promotion gate (issue #17): is a candidate bundle no worse than the active one?

Pure: inputs are the two bundles' manifests and, when the caller can score them, whole-model
estimates of finished TrainingJobs by each bundle. The measures:

- **random split**: per kernel, the held-out MAPE of the manifest's ``random_split`` metrics;
- **leave-one-GPU-out**: per kernel, the held-out MAPE of the manifest's
  ``leave_one_device_out`` refits (transfer model on the GPUs left out), row-weighted over the
  devices *both* manifests report, so the two are scored on the same GPUs. These are the
  refits `gpuplan train` already runs on the database's rows (`fitting.validate_kernel`); the
  gate reads them instead of refitting the active bundle's recipe again (minutes per kernel);
- **job outcomes**: MAPE of each bundle's estimate of finished TrainingJobs vs their actual
  seconds, only when the caller scored both bundles on the same jobs (`OutcomeScores`).

A measure fails when the candidate's MAPE exceeds the active one's by more than
`TOLERANCE_RATIO`; the decision's reason names the first failing measure and kernel.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

TOLERANCE_RATIO = 1.02
"""A candidate passes a measure when its MAPE <= the active one's x this. New rows change the
held-out split itself, so two equally good models differ by split noise; 2 % relative (e.g.
10.0 % vs 10.2 % MAPE) lets such a candidate through while a real regression does not pass. A
chosen constant, not a fitted one."""
TOLERANCE_ABS_PCT = 0.05
"""Absolute slack in MAPE percentage points, so a kernel at ~0 % MAPE is not refused over
rounding (manifests round MAPE to 3 decimals)."""

RANDOM_SPLIT = "random-split MAPE"
LEAVE_ONE_GPU_OUT = "leave-one-GPU-out MAPE"
JOB_OUTCOMES = "job-outcome MAPE"


@dataclasses.dataclass(frozen=True)
class Check:
    """One compared figure: a measure for one kernel (or "all jobs"), both MAPEs in percent."""

    measure: str
    scope: str
    candidate_pct: float | None
    """None: the candidate lacks what the active bundle has (a kernel it no longer models)."""
    active_pct: float

    @property
    def passed(self) -> bool:
        """No worse than the active bundle within the tolerance."""
        return self.candidate_pct is not None and self.candidate_pct <= (
            self.active_pct * TOLERANCE_RATIO + TOLERANCE_ABS_PCT)

    def describe(self) -> str:
        """E.g. "random-split MAPE of conv2d: 12.40 % vs active 10.10 %"."""
        if self.candidate_pct is None:
            return f"{self.measure} of {self.scope}: the candidate has none (active " \
                   f"{self.active_pct:.2f} %)"
        return (f"{self.measure} of {self.scope}: {self.candidate_pct:.2f} % vs active "
                f"{self.active_pct:.2f} %")


@dataclasses.dataclass(frozen=True)
class OutcomeScores:
    """Whole-model estimates of the same finished jobs by each bundle, in seconds."""

    actual_seconds: Sequence[float]
    candidate_seconds: Sequence[float]
    active_seconds: Sequence[float]


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether to promote, why, every figure compared and the measures that were skipped."""

    promote: bool
    reason: str
    checks: tuple[Check, ...]
    skipped: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {"promote": self.promote, "reason": self.reason, "skipped": list(self.skipped),
                "checks": [{"measure": c.measure, "scope": c.scope,
                            "candidate_mape_pct": c.candidate_pct,
                            "active_mape_pct": c.active_pct, "passed": c.passed}
                           for c in self.checks]}


def _mape(entry: Any) -> float | None:
    value = entry.get("mape_pct") if isinstance(entry, Mapping) else None
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _rows(entry: Any) -> float:
    value = entry.get("rows") if isinstance(entry, Mapping) else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return 1.0


def _metrics(manifest: Mapping[str, Any]) -> Mapping[str, Any]:
    metrics = manifest.get("metrics")
    return metrics if isinstance(metrics, Mapping) else {}


def random_split_mapes(manifest: Mapping[str, Any]) -> dict[str, float]:
    """Per kernel: the manifest's random-split held-out MAPE (%)."""
    out = {}
    for kernel, m in _metrics(manifest).items():
        value = _mape(m.get("random_split")) if isinstance(m, Mapping) else None
        if value is not None:
            out[str(kernel)] = value
    return out


def leave_one_gpu_out(manifest: Mapping[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """Per kernel, per left-out device: (MAPE %, held-out rows) of the manifest's refits."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for kernel, m in _metrics(manifest).items():
        loo = m.get("leave_one_device_out") if isinstance(m, Mapping) else None
        for device, entry in (loo.items() if isinstance(loo, Mapping) else ()):
            value = _mape(entry)
            if value is not None:
                out.setdefault(str(kernel), {})[str(device)] = (value, _rows(entry))
    return out


def _weighted(values: Mapping[str, tuple[float, float]], devices: Sequence[str]) -> float:
    total = sum(values[d][1] for d in devices)
    return sum(values[d][0] * values[d][1] for d in devices) / total


def manifest_checks(candidate: Mapping[str, Any], active: Mapping[str, Any]) -> list[Check]:
    """Random-split and leave-one-GPU-out checks, kernel by kernel (sorted)."""
    checks = []
    cand_rs, act_rs = random_split_mapes(candidate), random_split_mapes(active)
    for kernel in sorted(act_rs):
        checks.append(Check(RANDOM_SPLIT, kernel, cand_rs.get(kernel), act_rs[kernel]))
    cand_lo, act_lo = leave_one_gpu_out(candidate), leave_one_gpu_out(active)
    for kernel in sorted(act_lo):
        mine = cand_lo.get(kernel, {})
        common = sorted(set(mine) & set(act_lo[kernel]))
        if not common:
            continue  # no GPU left out by both: nothing comparable (a new GPU set)
        # Rows weigh the active side by its own held-out rows per GPU: the same GPUs, each
        # bundle's own refit.
        checks.append(Check(LEAVE_ONE_GPU_OUT, kernel, _weighted(mine, common),
                            _weighted(act_lo[kernel], common)))
    return checks


def outcome_mape_pct(actual_seconds: Sequence[float], estimated_seconds: Sequence[float]
                     ) -> float:
    """Mean absolute percentage error of whole-job estimates (%)."""
    if len(actual_seconds) != len(estimated_seconds) or not actual_seconds:
        raise ValueError("need the same non-zero number of actual and estimated seconds")
    return 100 * sum(abs(e - a) / a for a, e in zip(actual_seconds, estimated_seconds,
                                                    strict=True)) / len(actual_seconds)


def decide(candidate: Mapping[str, Any], active: Mapping[str, Any] | None, *,
           outcomes: OutcomeScores | None = None, outcomes_skipped: str = "") -> Decision:
    """Promote when the candidate is no worse on every measure (`active` None: nothing to beat).

    `outcomes_skipped` says why no `OutcomeScores` were given; it goes into `skipped`.
    """
    skipped = (f"{JOB_OUTCOMES}: {outcomes_skipped}",) if outcomes is None and \
        outcomes_skipped else ()
    if active is None:
        return Decision(True, "no active bundle to compare with", (), skipped)
    checks = manifest_checks(candidate, active)
    if outcomes is not None and outcomes.actual_seconds:
        checks.append(Check(
            JOB_OUTCOMES, f"{len(outcomes.actual_seconds)} finished jobs",
            outcome_mape_pct(outcomes.actual_seconds, outcomes.candidate_seconds),
            outcome_mape_pct(outcomes.actual_seconds, outcomes.active_seconds)))
    if not checks:
        return Decision(False, "no measure in common with the active bundle (its manifest "
                        "has no held-out metrics): promote with --force", (), skipped)
    failed = [c for c in checks if not c.passed]
    if failed:
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        return Decision(False, f"worse than the active bundle on {failed[0].describe()}{more}",
                        tuple(checks), skipped)
    measures = sorted({c.measure for c in checks})
    return Decision(True, f"no worse on {', '.join(measures)} ({len(checks)} checks)",
                    tuple(checks), skipped)
