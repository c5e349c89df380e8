"""Pure calibration of whole-model predictions from measured whole-model runs (job outcomes).

Per-layer models are trained on isolated kernels; a whole model runs them back to back (warm
caches, overlapped launches, sustained clocks) and differs from the sum by a device- and
mode-dependent factor. Given measured runs of *other* jobs, `fit` learns that factor as a log
ratio with hierarchical shrinkage — global → mode → (device, mode) — so one outcome moves a
device's factor only part of the way, and a device without outcomes inherits the mode's factor.
Each group weighs its outcomes by namespace (`namespace_weights`), so one tenant flooding a GPU
type with outcomes holds a bounded share of the factor every tenant is planned with (issue #33).
`apply` scales a prediction and widens its interval by the spread the outcomes showed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.quantiles import Z90


@dataclass(frozen=True)
class Outcome:
    """One measured whole-model run next to what was predicted for it (ms)."""

    device: str  # canonical catalog key
    mode: str  # "train" | "inference" (a suffix such as "/compiled" keeps variants apart)
    predicted_ms: float
    measured_ms: float
    model: str = ""  # for leave-one-model-out evaluation; not used by `fit`
    namespace: str = ""  # the TrainingJob's namespace; "" for rows that predate it (one tenant)


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
    max_namespace_share: float = 0.34
    """Most of a group's outcome weight one namespace may hold (`namespace_weights`); with
    fewer than 1/share namespaces in a group, each holds at most an equal part (1/count)."""


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


def namespace_cap(counts: Sequence[int], max_share: float) -> float:
    """The most outcome weight any one namespace keeps in a group with these per-namespace
    outcome counts: the largest `c` with ``c <= share * sum(min(n, c))``, where the share is
    `max_share`, raised to 1/len(counts) when that few namespaces cannot meet it.

    Namespaces under the cap keep every outcome at full weight; one namespace alone, or every
    namespace already within the share, is not capped at all (the cap is the largest count).
    """
    share = max(max_share, 1.0 / len(counts))
    ordered = sorted(counts)
    below = 0.0  # outcomes of the namespaces under the segment, all kept whole
    segments = []
    for i, n in enumerate(ordered):
        segments.append((i, below, float(ordered[i - 1]) if i else 0.0, float(n)))
        below += n
    # Segment i: the cap lies between the i-th and (i+1)-th smallest count; the others are capped.
    for i, whole, low, high in reversed(segments):
        capped = len(ordered) - i
        slack = 1.0 - share * capped
        cap = high if slack <= 0 else min(high, share * whole / slack)
        if cap >= low:
            return cap
    raise AssertionError("unreachable: the first segment always holds the cap")


def namespace_weights(namespaces: Sequence[str], max_share: float) -> list[float]:
    """Each outcome's weight in its group: a namespace's outcomes share `namespace_cap` of
    weight equally when it has more outcomes than that, else each weighs 1."""
    counts: dict[str, int] = {}
    for ns in namespaces:
        counts[ns] = counts.get(ns, 0) + 1
    cap = namespace_cap(list(counts.values()), max_share)
    return [min(1.0, cap / counts[ns]) for ns in namespaces]


def _shrunk(ratios: Sequence[float], weights: Sequence[float], parent: Correction,
            settings: CalibrationSettings, level: str) -> Correction:
    """Posterior-mean-style blend of the group's weighted mean with the parent's log factor.

    With every weight 1 this is the plain mean and pooled spread, to the last bit."""
    weight = sum(weights)
    parent_log = math.log(parent.factor)
    mean = sum(w * r for w, r in zip(weights, ratios, strict=True)) / weight
    log_factor = (weight * mean + settings.prior_outcomes * parent_log) / (
        weight + settings.prior_outcomes)
    resid = [(w, r - log_factor) for w, r in zip(weights, ratios, strict=True)]
    # Pool with the parent's spread by the same weights: a single outcome says little about spread.
    var = (sum(w * x * x for w, x in resid) + settings.prior_outcomes * parent.log_sd**2) / (
        weight + settings.prior_outcomes)
    sd = max(settings.min_log_sd, math.sqrt(var))
    return Correction(math.exp(log_factor), sd, len(ratios), level)


def _group(rows: Sequence[tuple[Outcome, float]], parent: Correction,
           settings: CalibrationSettings, level: str) -> Correction:
    weights = namespace_weights([o.namespace for o, _ in rows], settings.max_namespace_share)
    return _shrunk([r for _, r in rows], weights, parent, settings, level)


def fit(outcomes: Iterable[Outcome],
        settings: CalibrationSettings | None = None) -> CalibrationTable:
    """Hierarchical corrections from measured outcomes; no outcomes → identity."""
    settings = settings or CalibrationSettings()
    if settings.prior_outcomes <= 0 or settings.min_log_sd <= 0 or settings.prior_log_sd <= 0:
        raise InvalidRequestError("settings", "prior_outcomes and the log sds must be positive")
    if not 0 < settings.max_namespace_share <= 1:
        raise InvalidRequestError("settings", "max_namespace_share must be in (0, 1], got "
                                  f"{settings.max_namespace_share}")
    rows = [(o, _log_ratio(o, settings)) for o in outcomes]
    identity = Correction(1.0, settings.prior_log_sd, 0, "none")
    if not rows:
        return CalibrationTable(overall=identity)
    overall = _group(rows, identity, settings, "global")
    by_mode: dict[str, Correction] = {}
    for mode in sorted({o.mode for o, _ in rows}):
        by_mode[mode] = _group([x for x in rows if x[0].mode == mode], overall, settings, "mode")
    by_dm: dict[tuple[str, str], Correction] = {}
    for key in sorted({(o.device, o.mode) for o, _ in rows}):
        by_dm[key] = _group([x for x in rows if (x[0].device, x[0].mode) == key],
                            by_mode[key[1]], settings, "device+mode")
    return CalibrationTable(by_device_mode=by_dm, by_mode=by_mode, overall=overall)


def tenant_factor_range(others_log_ratios: Sequence[float], namespaces_in_group: int,
                        settings: CalibrationSettings | None = None) -> tuple[float, float]:
    """Where one tenant can put a (device, mode) factor, whatever outcomes it posts: the
    stated bound of issue #33.

    Why: in every group (global, mode, device+mode) the tenant holds at most the share
    ``s = max(max_namespace_share, 1/namespaces_in_group)`` of the outcome weight, so at most
    ``s * (1 - pi)`` of that level's log factor, ``pi`` being the parent's prior weight there.
    Unrolling the chain device+mode → mode → global → identity, its outcomes hold at most ``s``
    of the final log factor; the rest is a convex blend of the other tenants' clipped log
    ratios and the identity's 0. With those in ``[a, b]`` (0 included) and its own clipped to
    ``±L`` (`max_abs_log_ratio`), the log factor lies in ``[(1-s) a - s L, (1-s) b + s L]``.
    With others at factor 1 and s = 0.34 that is ×/÷ 4**0.34 ≈ 1.60; a 3× flood gets at most
    3**0.34 ≈ 1.45 over the others' largest ratio. `namespaces_in_group` counts the tenant too.
    """
    settings = settings or CalibrationSettings()
    if namespaces_in_group < 1:
        raise InvalidRequestError("namespaces_in_group", f"must be >= 1, got {namespaces_in_group}")
    share = max(settings.max_namespace_share, 1.0 / namespaces_in_group)
    low = min([0.0, *others_log_ratios])
    high = max([0.0, *others_log_ratios])
    limit = settings.max_abs_log_ratio
    return (math.exp((1 - share) * low - share * limit),
            math.exp((1 - share) * high + share * limit))


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
    spread = math.exp(Z90 * c.log_sd)
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


def single_gpu_compute_factor(rows: Iterable[Mapping[str, Any]],
                              settings: CalibrationSettings | None = None
                              ) -> Callable[[str], float]:
    """Per device, the calibration factor of the single-GPU training outcomes among `rows`:
    they measure compute alone, so the scaling fit need not absorb a compute error (a device
    without any inherits the global factor; no single-GPU outcome at all: 1). Rows weigh by
    their `namespace` like the calibration's (`settings`, default `CalibrationSettings()`)."""
    single = [Outcome(str(r["device"]), "train",
                                  predicted_ms=float(r["estimated_seconds"]) * 1000.0,
                                  measured_ms=float(r["actual_seconds"]) * 1000.0,
                                  namespace=str(r.get("namespace") or ""))
              for r in rows if int(r["gpu_count"]) == 1]
    fitted = fit(single, settings)
    return lambda device: fitted.correction(device, "train").factor
