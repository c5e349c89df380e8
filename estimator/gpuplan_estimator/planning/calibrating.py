"""Pure calibration of whole-model predictions from measured whole-model runs (job outcomes).

Per-layer models are trained on isolated kernels; a whole model runs them back to back (warm
caches, overlapped launches, sustained clocks) and differs from the sum by a device- and
mode-dependent factor. Given measured runs of *other* jobs, `fit` learns that factor as a log
ratio with hierarchical shrinkage — global → mode → (device, mode) — so one outcome moves a
device's factor only part of the way, and a device without outcomes inherits the mode's factor.
`apply` scales a prediction and widens its interval by the spread the outcomes showed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Any

from gpuplan_estimator.core.errors import InvalidRequestError

_Z90 = NormalDist().inv_cdf(0.9)  # P10/P90 of a normal log-ratio are mean ∓ 1.2816 sd


@dataclass(frozen=True)
class Outcome:
    """One measured whole-model run next to what was predicted for it (ms)."""

    device: str  # canonical catalog key
    mode: str  # "train" | "inference" (a suffix such as "/compiled" keeps variants apart)
    predicted_ms: float
    measured_ms: float
    model: str = ""  # for leave-one-model-out evaluation; not used by `fit`


@dataclass(frozen=True)
class CalibrationSettings:
    """How strongly outcomes move the factor; all in natural-log units of the ratio."""

    prior_outcomes: float = 3.0
    """Pseudo-count pulling each level toward its parent (global's parent is ratio 1)."""
    max_abs_log_ratio: float = math.log(4.0)
    """Outcomes further off than ×4 are treated as bad records (clipped), not as signal."""
    min_log_sd: float = 0.03
    """Floor of the residual spread so one or two agreeing outcomes never claim certainty."""
    prior_log_sd: float = 0.15
    """Spread assumed before any outcome (≈ ±15 % at one sd)."""


@dataclass(frozen=True)
class Correction:
    """Multiply a prediction by `factor`; `log_sd` is the residual spread.

    `level` says where the factor came from ("device+mode", "mode", "global" or "none").
    """

    factor: float
    log_sd: float
    outcomes: int
    level: str

    def as_dict(self) -> dict[str, float | int | str]:
        """What plans and estimates report: the spread is already in their intervals."""
        return {"factor": self.factor, "outcomes": self.outcomes, "level": self.level}


IDENTITY = Correction(1.0, CalibrationSettings().prior_log_sd, 0, "none")
"""What a device gets before any outcome: factor 1, the prior spread."""


def mode_of(training_mode: str) -> str:
    """The calibration mode of a request's `training.mode`: anything but training is inference."""
    return "train" if training_mode == "train" else "inference"


@dataclass(frozen=True)
class CalibrationTable:
    """Fitted corrections: per (device, mode), per mode, and global."""

    by_device_mode: Mapping[tuple[str, str], Correction] = field(default_factory=dict)
    by_mode: Mapping[str, Correction] = field(default_factory=dict)
    overall: Correction = IDENTITY

    def correction(self, device: str, mode: str) -> Correction:
        """The most specific correction known for `device` in `mode`."""
        found = self.by_device_mode.get((device, mode))
        if found is not None:
            return found
        return self.by_mode.get(mode, self.overall)


def _log_ratio(o: Outcome, settings: CalibrationSettings) -> float:
    if not (o.predicted_ms > 0 and o.measured_ms > 0
            and math.isfinite(o.predicted_ms) and math.isfinite(o.measured_ms)):
        raise InvalidRequestError(
            "outcome", f"{o.device}/{o.mode}: predicted_ms and measured_ms must be positive")
    r = math.log(o.measured_ms / o.predicted_ms)
    return max(-settings.max_abs_log_ratio, min(settings.max_abs_log_ratio, r))


def _shrunk(ratios: Sequence[float], parent: Correction, settings: CalibrationSettings,
            level: str) -> Correction:
    """Posterior-mean-style blend of the group mean with the parent's log factor."""
    n = len(ratios)
    parent_log = math.log(parent.factor)
    mean = sum(ratios) / n
    log_factor = (n * mean + settings.prior_outcomes * parent_log) / (n + settings.prior_outcomes)
    resid = [r - log_factor for r in ratios]
    # Pool with the parent's spread by the same weights: a single outcome says little about spread.
    var = (sum(x * x for x in resid) + settings.prior_outcomes * parent.log_sd**2) / (
        n + settings.prior_outcomes)
    sd = max(settings.min_log_sd, math.sqrt(var))
    return Correction(math.exp(log_factor), sd, n, level)


def fit(outcomes: Iterable[Outcome],
        settings: CalibrationSettings | None = None) -> CalibrationTable:
    """Hierarchical corrections from measured outcomes; no outcomes → identity."""
    settings = settings or CalibrationSettings()
    if settings.prior_outcomes <= 0 or settings.min_log_sd <= 0 or settings.prior_log_sd <= 0:
        raise InvalidRequestError("settings", "prior_outcomes and the log sds must be positive")
    rows = [(o, _log_ratio(o, settings)) for o in outcomes]
    identity = Correction(1.0, settings.prior_log_sd, 0, "none")
    if not rows:
        return CalibrationTable(overall=identity)
    overall = _shrunk([r for _, r in rows], identity, settings, "global")
    by_mode: dict[str, Correction] = {}
    for mode in sorted({o.mode for o, _ in rows}):
        by_mode[mode] = _shrunk([r for o, r in rows if o.mode == mode], overall, settings, "mode")
    by_dm: dict[tuple[str, str], Correction] = {}
    for key in sorted({(o.device, o.mode) for o, _ in rows}):
        ratios = [r for o, r in rows if (o.device, o.mode) == key]
        by_dm[key] = _shrunk(ratios, by_mode[key[1]], settings, "device+mode")
    return CalibrationTable(by_device_mode=by_dm, by_mode=by_mode, overall=overall)


@dataclass(frozen=True)
class Calibrated:
    """A calibrated prediction: median and p10/p90 in ms, and the correction applied."""
    median_ms: float
    p10_ms: float
    p90_ms: float
    correction: Correction


def apply(calibration: CalibrationTable, device: str, mode: str, median_ms: float, p10_ms: float,
          p90_ms: float) -> Calibrated:
    """Scale a prediction; the interval is the wider of the scaled one and the outcome spread."""
    if not (0 <= p10_ms <= median_ms <= p90_ms):
        raise InvalidRequestError("interval", f"need 0 <= p10 <= median <= p90, got "
                                  f"{p10_ms}, {median_ms}, {p90_ms}")
    c = calibration.correction(device, mode)
    med = median_ms * c.factor
    spread = math.exp(_Z90 * c.log_sd)
    return Calibrated(med, min(p10_ms * c.factor, med / spread),
                      max(p90_ms * c.factor, med * spread), c)


def calibrate(calibration: CalibrationTable, device: str, mode: str, median_ms: float,
              p10_ms: float, p90_ms: float) -> Calibrated:
    """`apply` at plan/estimate time: without any outcome the prediction is returned unchanged.

    `apply` widens every interval by the prior spread even at factor 1, which is what the
    evaluation compares against; a service that has never seen a job has learned nothing, so its
    answers stay exactly the model's. The interval bounds are clamped around the median first:
    they are sums over a step's items, and float rounding may put them a hair on the wrong side.
    """
    c = calibration.correction(device, mode)
    low, high = min(p10_ms, median_ms), max(p90_ms, median_ms)
    if c.outcomes == 0:
        return Calibrated(median_ms, low, high, c)
    return apply(calibration, device, mode, median_ms, low, high)


def outcomes_excluding(outcomes: Sequence[Outcome], *, model: str | None = None,
                       device: str | None = None) -> tuple[Outcome, ...]:
    """Outcomes of other models / devices: the honest training set for a held-out row."""
    return tuple(o for o in outcomes
                 if (model is None or o.model != model) and (device is None or o.device != device))


def summary(calibration: CalibrationTable) -> Mapping[str, float]:
    """Flat "device/mode" → factor map for reports."""
    out = {f"{d}/{m}": c.factor for (d, m), c in calibration.by_device_mode.items()}
    out.update({f"*/{m}": c.factor for m, c in calibration.by_mode.items()})
    out["*/*"] = calibration.overall.factor
    return out


def single_gpu_compute_factor(rows: Iterable[Mapping[str, Any]]) -> Callable[[str], float]:
    """Per device, the calibration factor of the single-GPU training outcomes among `rows`:
    they measure compute alone, so the scaling fit need not absorb a compute error (a device
    without any inherits the global factor; no single-GPU outcome at all: 1)."""
    single = [Outcome(str(r["device"]), "train",
                                  predicted_ms=float(r["estimated_seconds"]) * 1000.0,
                                  measured_ms=float(r["actual_seconds"]) * 1000.0)
              for r in rows if int(r["gpu_count"]) == 1]
    fitted = fit(single)
    return lambda device: fitted.correction(device, "train").factor
