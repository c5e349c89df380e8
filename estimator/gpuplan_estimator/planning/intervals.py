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
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
Z90 = 1.2815515655446004
"""The standard normal's 90th percentile: P10-P90 is median x exp(+-Z90 sigma)."""
MANIFEST_KEY = "interval_log_sigma"
"""Bundle manifest key: {basis: {kernel: sigma}}, the shared log-error per kernel family."""
SYNTHETIC_MODEL_KERNELS = 30
"""Distinct shapes of one family in one synthetic model: a ResNet-50 has ~20 distinct conv
shapes, a GPT-2 ~10 gemm shapes per phase; 30 keeps a group's own scatter small, as in a model."""
SYNTHETIC_MODELS = 200
"""Synthetic models drawn per (device, family): enough for a stable RMS (its error ~5 %)."""


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


def step_interval(median_ms: FloatArray, p10_ms: FloatArray, p90_ms: FloatArray,
                  kernels: Sequence[str], shared_sigma: Mapping[str, float] | None
                  ) -> tuple[float, float]:
    """(P10, P90) ms of a step from its distinct kernel shapes' totals (median, P10, P90, each
    already times its count) and their families; `shared_sigma` None: quantiles summed."""
    total = float(median_ms.sum())
    if shared_sigma is None or total <= 0.0:
        # Clamped: summed in another order, equal quantiles can differ from the median by an ulp.
        return min(float(p10_ms.sum()), total), max(float(p90_ms.sum()), total)
    ratio = np.where(p10_ms > 0, p90_ms / np.where(p10_ms > 0, p10_ms, 1.0), 1.0)
    own = np.log(np.maximum(ratio, 1.0)) / (2 * Z90)  # each shape's log-sd from its P10-P90
    var = float(np.sum(np.square(median_ms * own)))
    by_family: dict[str, float] = {}
    for kernel, ms in zip(kernels, median_ms, strict=True):
        by_family[kernel] = by_family.get(kernel, 0.0) + float(ms)
    var += sum((ms * shared_sigma.get(k, 0.0)) ** 2 for k, ms in by_family.items())
    sigma = math.sqrt(var) / total
    return total * math.exp(-Z90 * sigma), total * math.exp(Z90 * sigma)


def manifest_sigmas(manifest: Mapping[str, object], data_basis: str) -> Mapping[str, float] | None:
    """The bundle's shared log-sigma per kernel for a device of `data_basis`, or None."""
    table = manifest.get(MANIFEST_KEY)
    if not isinstance(table, Mapping):
        return None
    sigmas = table.get(data_basis)
    if not isinstance(sigmas, Mapping) or not sigmas:
        return None
    return {str(k): float(v) for k, v in sigmas.items()}
