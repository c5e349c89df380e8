"""A step's P10-P90 interval from its kernels' intervals, with the error they share.

Summing per-kernel quantiles assumes every kernel errs in the same direction by the same
quantile, yet it still covered only 18-45 % of whole-model labels (docs/accuracy.md): the
kernel intervals describe how one shape scatters around the model, not that the model is off
for a whole GPU. The error of a step is modelled as two parts, in log space:

- independent per distinct kernel shape: the spread of its own P10-P90 (identical shapes in
  several layers err together, so they are one term);
- shared by every kernel of one kernel family on the device (`gemm`, `conv2d`, ...): what a
  model gets wrong about a GPU it has not measured, a bias that a whole model inherits. Its
  standard deviation comes from held-out data at training time (`synthetic_model_log_errors`
  over leave-one-GPU-out op rows, pooled by `shared_log_sigma`), never from whole-model labels.

Families are independent of one another. With no shared estimate for the device (a bundle that
predates them, or a measured GPU), the comonotone bound (quantiles summed) is kept.

The shared error depends on how long a kernel runs: a launch-bound kernel errs by what the GPU's
floor is, a long one by how much of the peak the GPU sustains, and the two differ per GPU
(leave-one-GPU-out gemm rows of 5 ms and more err by 0.19-0.25 log-sigma, those of 0.05-5 ms by
0.12-0.18). Whole models spend most of their time in long kernels, so one sigma pooled over all
sizes, most of them short, understated it. The shared sigma is therefore kept per duration band
(`DURATION_BAND_EDGES_MS`) of the kernel's predicted time, with the family's all-sizes figure
where a band had too few held-out rows (`MIN_BAND_ROWS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from gpuplan_estimator.core import precisions
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.quantiles import Z90

FloatArray = npt.NDArray[np.float64]
MANIFEST_KEY = "interval_log_sigma"
"""Bundle manifest key: {basis: {kernel: sigma}}, the shared log-error per kernel family."""
SYNTHETIC_MODEL_KERNELS = 30
"""Distinct shapes of one family in one synthetic model: a ResNet-50 has ~20 distinct conv
shapes, a GPT-2 ~10 gemm shapes per phase; 30 keeps a group's own scatter small, as in a model."""
SYNTHETIC_MODELS = 200
"""Synthetic models drawn per (device, family): enough for a stable RMS (its error ~5 %)."""
DURATION_BAND_EDGES_MS = (0.05, 0.5, 5.0)
"""Upper edges of the duration bands but the last: launch-bound (< 0.05 ms, the eager floor is
~0.025 ms), short, medium, and long (>= 5 ms, where sustained clocks and power caps show)."""
BAND_NAMES = ("<0.05ms", "0.05-0.5ms", "0.5-5ms", ">=5ms")
MIN_BAND_ROWS = 30
"""Held-out rows a device needs in a band to say anything about it: one synthetic model's worth."""


@dataclass(frozen=True)
class SharedSigma:
    """One kernel family's shared log-sigma: over all sizes, and per duration band (None where
    no device had `MIN_BAND_ROWS` held-out rows in it: the all-sizes figure stands in)."""

    all_sizes: float
    by_band: tuple[float | None, ...] = (None,) * len(BAND_NAMES)

    def __post_init__(self) -> None:
        if len(self.by_band) != len(BAND_NAMES):
            raise ValueError(f"need {len(BAND_NAMES)} bands, got {len(self.by_band)}")

    def at(self, instance_ms: FloatArray) -> FloatArray:
        """The sigma of kernels predicted to take `instance_ms` each."""
        table = np.array([self.all_sizes if s is None else s for s in self.by_band])
        return np.asarray(table[band_index(instance_ms)], dtype=np.float64)

    def to_manifest(self) -> dict[str, object]:
        """The bundle manifest's JSON form, bands by name."""
        return {"all_sizes": self.all_sizes, "by_band": dict(zip(BAND_NAMES, self.by_band,
                                                                 strict=True))}

    @classmethod
    def from_manifest(cls, value: object) -> SharedSigma:
        """From `to_manifest`'s form, or a bare number (bundles written before the bands)."""
        if isinstance(value, int | float):
            return cls(float(value))
        if not isinstance(value, Mapping):
            raise ValueError(f"a shared sigma is a number or a mapping, got {value!r}")
        bands = value.get("by_band", {})
        if not isinstance(bands, Mapping):
            raise ValueError(f"by_band must be a mapping, got {bands!r}")
        return cls(float(value["all_sizes"]),
                   tuple(None if bands.get(n) is None else float(bands[n]) for n in BAND_NAMES))


def band_index(instance_ms: FloatArray) -> npt.NDArray[np.intp]:
    """Duration band of each time (`DURATION_BAND_EDGES_MS`; an edge opens the band above)."""
    return np.searchsorted(np.asarray(DURATION_BAND_EDGES_MS), np.asarray(instance_ms),
                           side="right")


def synthetic_model_log_errors(actual_ms: FloatArray, predicted_ms: FloatArray, *,
                               kernels: int = SYNTHETIC_MODEL_KERNELS,
                               models: int = SYNTHETIC_MODELS, seed: int = 0) -> FloatArray:
    """Mean log(predicted / measured) of `models` random groups of `kernels` held-out rows.

    Each group is a synthetic model's shapes of one family: its mean log error is the shift
    all of them share plus 1/sqrt(`kernels`) of their own scatter. Shapes are weighted equally,
    not by time: op rows span six orders of magnitude, so a group's summed time would be one
    row's, and its error that row's own, which the shapes' intervals already carry.
    """
    n = len(actual_ms)
    if n == 0 or len(predicted_ms) != n:
        raise ValueError(f"need equally long non-empty arrays, got {n} and {len(predicted_ms)}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, n, size=(models, min(kernels, n)))
    return np.asarray(np.log(predicted_ms[idx] / actual_ms[idx]).mean(axis=1))


def shared_log_sigma(errors_by_device: Mapping[str, FloatArray]) -> float:
    """Root mean square of the devices' synthetic-model log errors, each device weighted
    equally: the spread one more, unseen device's family is expected to have."""
    if not errors_by_device:
        raise ValueError("no device's errors to pool")
    return math.sqrt(float(np.mean([np.mean(np.square(e)) for e in errors_by_device.values()])))


def synthetic_model_log_errors_by_band(actual_ms: FloatArray, predicted_ms: FloatArray, *,
                                       seed: int = 0) -> dict[int, FloatArray]:
    """`synthetic_model_log_errors` of the rows in each duration band of their predicted time
    (the only time an estimate knows), for the bands with at least `MIN_BAND_ROWS` rows."""
    bands = band_index(predicted_ms)
    return {int(b): synthetic_model_log_errors(actual_ms[bands == b], predicted_ms[bands == b],
                                               seed=seed)
            for b in range(len(BAND_NAMES)) if np.count_nonzero(bands == b) >= MIN_BAND_ROWS}


def shared_sigma(actual_by_device: Mapping[str, tuple[FloatArray, FloatArray]], *,
                 seed: int = 0) -> SharedSigma:
    """A family's `SharedSigma` from its left-out devices' (measured, predicted) op rows."""
    whole = {d: synthetic_model_log_errors(a, p, seed=seed)
             for d, (a, p) in actual_by_device.items()}
    banded = {d: synthetic_model_log_errors_by_band(a, p, seed=seed)
              for d, (a, p) in actual_by_device.items()}
    by_band: list[float | None] = []
    for b in range(len(BAND_NAMES)):
        have = {d: e[b] for d, e in banded.items() if b in e}
        by_band.append(round(shared_log_sigma(have), 5) if have else None)
    return SharedSigma(round(shared_log_sigma(whole), 5), tuple(by_band))


def shape_log_sigmas(sigmas: Mapping[str, SharedSigma], kernels: Sequence[str],
                     instance_ms: FloatArray) -> FloatArray:
    """Each distinct shape's shared log-sigma: its family's, at its own predicted time; 0 for
    a family without one (its shapes share no error beyond their own intervals)."""
    instance_ms = np.asarray(instance_ms, dtype=np.float64)
    out = np.zeros(len(kernels))
    for kernel, sigma in sigmas.items():
        mine = np.fromiter((k == kernel for k in kernels), dtype=bool, count=len(kernels))
        if mine.any():
            out[mine] = sigma.at(instance_ms[mine])
    return out


def step_interval(median_ms: FloatArray, p10_ms: FloatArray, p90_ms: FloatArray,
                  kernels: Sequence[str], shared_log_sd: FloatArray | None
                  ) -> tuple[float, float]:
    """(P10, P90) ms of a step from its distinct kernel shapes' totals (median, P10, P90, each
    already times its count), their families and each shape's shared log-sigma
    (`shape_log_sigmas`); `shared_log_sd` None: quantiles summed."""
    total = float(median_ms.sum())
    if shared_log_sd is None or total <= 0.0:
        # Clamped: summed in another order, equal quantiles can differ from the median by an ulp.
        return min(float(p10_ms.sum()), total), max(float(p90_ms.sum()), total)
    ratio = np.where(p10_ms > 0, p90_ms / np.where(p10_ms > 0, p10_ms, 1.0), 1.0)
    own = np.log(np.maximum(ratio, 1.0)) / (2 * Z90)  # each shape's log-sd from its P10-P90
    var = float(np.sum(np.square(median_ms * own)))
    # A family errs as one: its shapes' shared parts add up before they are squared.
    by_family: dict[str, float] = {}
    for kernel, ms, sd in zip(kernels, median_ms, shared_log_sd, strict=True):
        by_family[kernel] = by_family.get(kernel, 0.0) + float(ms) * float(sd)
    var += sum(v * v for v in by_family.values())
    sigma = math.sqrt(var) / total
    return total * math.exp(-Z90 * sigma), total * math.exp(Z90 * sigma)


def manifest_sigmas(manifest: Mapping[str, object], data_basis: str
                    ) -> Mapping[str, SharedSigma] | None:
    """The bundle's shared sigma per kernel for a device of `data_basis`, or None."""
    table = manifest.get(MANIFEST_KEY)
    if not isinstance(table, Mapping):
        return None
    sigmas = table.get(data_basis)
    if not isinstance(sigmas, Mapping) or not sigmas:
        return None
    return {str(k): SharedSigma.from_manifest(v) for k, v in sigmas.items()}


STEP_SIGMA_KEY = "step_log_sigma"
"""Bundle manifest key: {step kind (`STEP_KINDS`): {math (`STEP_MATHS`): spread}}, how whole
GPU steps scatter around their estimate beyond, or within, what their kernels' intervals hold
(`with_step_spread`). A spread >= 0 is a log-sigma: how kernels compose into a step (launch
gaps, the kernel the library picks for a shape, overlap with the host) adds an error no kernel
benchmark sees. A spread < 0 is the log of the factor the interval's log half-widths shrink
by: kernels whose spreads were sized on other GPUs' rows (bf16 on an H200) can be wider than
the steps they compose. Fitted on profiled whole-model steps of a GPU run
(`training.step_spread`)."""
MIN_STEP_SPREAD = math.log(0.05)
"""The narrowest a step spread may make an interval: a twentieth of its kernels' width."""
STEP_SIGMA_PROVENANCE_KEY = f"{STEP_SIGMA_KEY}_provenance"
"""Where the manifest records how the step-level spread was fitted."""
STEP_KINDS = ("train", "inference")
"""A training step (forward, backward, optimizer) and an inference forward scatter apart: an
inference forward is short, so the host's share, and its error, is larger."""
STEP_MATHS = ("fp32", "tf32", "half")
"""The math a step's GEMMs run (`step_math`): each prices its tensor-core GEMMs another way
(fp32 on SIMT rows, tf32 and half from the profile-fitted utilisation), so each errs apart."""

StepSigma = Mapping[str, Mapping[str, float]]
"""A step-level spread: {kind: {math: spread}} (`STEP_SIGMA_KEY`)."""


def step_math(precision: str) -> str:
    """The `STEP_MATHS` of a precision's GEMMs: "half" under autocast, "tf32" when float32
    matmuls run on TF32, else "fp32"."""
    spec = precisions.precision(precision)
    return "half" if spec.autocast else "tf32" if spec.gemm_math else "fp32"


def no_step_sigma() -> dict[str, dict[str, float]]:
    """A spread of 0 everywhere: intervals from the kernels and host alone."""
    return {kind: dict.fromkeys(STEP_MATHS, 0.0) for kind in STEP_KINDS}


def manifest_step_sigma(manifest: Mapping[str, object]) -> StepSigma | None:
    """The bundle's `STEP_SIGMA_KEY` entry, checked (`step_sigma`), or None when it holds
    none."""
    entry = manifest.get(STEP_SIGMA_KEY)
    return None if entry is None else step_sigma(entry, f"manifest.{STEP_SIGMA_KEY}")


def step_sigma(entry: object, where: str) -> dict[str, dict[str, float]]:
    """A step-level spread, {kind: {math: spread}} for every `STEP_KINDS` and `STEP_MATHS`;
    InvalidRequestError naming `where` and the field when one is missing or not a finite
    number >= `MIN_STEP_SPREAD`."""
    if not isinstance(entry, Mapping):
        raise InvalidRequestError(where, "must be an object")
    out: dict[str, dict[str, float]] = {}
    for kind in STEP_KINDS:
        by_math = entry.get(kind)
        if not isinstance(by_math, Mapping):
            raise InvalidRequestError(f"{where}.{kind}",
                                      f"must map {', '.join(STEP_MATHS)} to numbers")
        out[kind] = {}
        for math_name in STEP_MATHS:
            value = by_math.get(math_name)
            if isinstance(value, bool) or not isinstance(value, int | float) \
                    or not math.isfinite(value) or value < MIN_STEP_SPREAD:
                raise InvalidRequestError(
                    f"{where}.{kind}.{math_name}",
                    f"must be a finite number >= {MIN_STEP_SPREAD:.4f}, not {value!r}")
            out[kind][math_name] = float(value)
    return out


def with_step_spread(interval_ms: tuple[float, float], median_ms: float, spread: float
                     ) -> tuple[float, float]:
    """`interval_ms` around `median_ms` under a step spread (`STEP_SIGMA_KEY`). A spread >= 0
    is an independent log-normal error of that sigma added on each side (the log half-widths
    add in quadrature, so a wide side widens less); a spread < 0 scales both log half-widths
    by exp(spread): the kernels' spreads, overstated, shrink in proportion."""
    if spread == 0 or median_ms <= 0:
        return interval_ms
    below = math.log(median_ms / interval_ms[0]) if interval_ms[0] > 0 else math.inf
    above = math.log(max(interval_ms[1], median_ms) / median_ms)
    below = max(below, 0.0)
    if spread < 0:
        scale = math.exp(max(spread, MIN_STEP_SPREAD))
        return median_ms * math.exp(-below * scale), median_ms * math.exp(above * scale)
    extra = (Z90 * spread) ** 2
    return (median_ms * math.exp(-math.sqrt(below ** 2 + extra)),
            median_ms * math.exp(math.sqrt(above ** 2 + extra)))
