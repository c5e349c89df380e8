"""The shared error of an unseen GPU, from leave-one-GPU-out op rows of a real fitted bundle."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import measurements
from gpuplan_estimator.cost import features
from gpuplan_estimator.latency import basis
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.training import fitting, shared_errors

KEYS = ("t4", "v100-pcie-32gb", "a100-pcie-40gb", "p100-pcie-16gb")
FAST = {"n_estimators": 25, "num_leaves": 15, "min_child_samples": 5, "n_jobs": 1}


def _gemm_rows(key: str, slowdown: float, rows: int = 150, seed: int = 0) -> pd.DataFrame:
    """gemm rows: a smooth efficiency of the feature base, times a device constant no spec
    explains (`slowdown`): the error a model of the other GPUs makes on this one."""
    rng = np.random.default_rng(seed)
    spec = devices.load_catalog().resolve(key)
    m, k, n = (rng.integers(64, 2048, rows) for _ in range(3))
    dims = {"batch": np.ones_like(m), "m": m, "k": k, "n": n, "bias": np.zeros_like(m)}
    dtype = np.full(rows, "float32")
    cols = features.WorkColumns("gemm", dims, dtype, np.full(rows, "gemm"))
    base = features.base_ms(cols, features.broadcast_device(spec, dtype, 0))
    latency = slowdown * base * (1.3 + 0.3 * np.sin(np.log(m))) * np.exp(
        rng.normal(0, 0.02, rows))
    return pd.DataFrame({
        "device": key, "backend": "pytorch-2.1.0+cu121", "kernel": "gemm", "op": "gemm",
        "dtype": "float32",
        "dims": [measurements.dims_to_json({d: int(v[i]) for d, v in dims.items()})
                 for i in range(rows)],
        "latency_ms": latency, "latency_std_ms": np.nan, "repeats": 25, "source": "synth"})


def _pooled(slowdowns: dict[str, float]) -> tuple[float, dict[str, float]]:
    frame = pd.concat([_gemm_rows(k, s, seed=i) for i, (k, s) in enumerate(slowdowns.items())],
                      ignore_index=True)
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    errors, bias = {}, {}
    for key in slowdowns:
        held = fitting.train_bundle(frame[frame["device"] != key], settings, validate=False)
        errors[key] = shared_errors.transfer_predictions(held, frame[frame["device"] == key])
        actual, predicted = errors[key]["gemm"]
        bias[key] = float(np.mean(np.log(predicted / actual)))
    return shared_errors.pooled_sigmas(errors)["gemm"].all_sizes, bias


def test_a_device_constant_no_spec_explains_becomes_the_shared_sigma() -> None:
    even, _ = _pooled(dict.fromkeys(KEYS, 1.0))
    uneven, bias = _pooled(dict(zip(KEYS, (1.0, 1.5, 0.7, 1.2), strict=True)))
    assert even < 0.1
    assert uneven > 0.2 and uneven > 2 * even
    # The slowest GPU, left out, is priced too fast: its synthetic models err low.
    assert bias["v100-pcie-32gb"] < -0.1 < 0.1 < bias["a100-pcie-40gb"]


def test_the_sigma_reaches_the_manifest_for_unseen_and_probed_gpus() -> None:
    frame = pd.concat([_gemm_rows(k, 1.0, seed=i) for i, k in enumerate(KEYS)],
                      ignore_index=True)
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    fitted = fitting.train_bundle(frame, settings, validate=False)
    sigma = intervals.SharedSigma(0.25, (0.2, 0.25, None, 0.3))
    with_sigma = shared_errors.with_shared_sigmas(fitted, {"gemm": sigma})
    for name in (basis.EXTRAPOLATED, basis.PROBED):
        assert intervals.manifest_sigmas(with_sigma.manifest, name) == {"gemm": sigma}
    assert intervals.manifest_sigmas(with_sigma.manifest, basis.MEASURED) is None
    assert with_sigma.models is fitted.models


def test_synthetic_model_errors_refuse_mismatched_rows() -> None:
    with pytest.raises(ValueError):
        intervals.synthetic_model_log_errors(np.ones(3), np.ones(2))
    assert math.isfinite(float(intervals.synthetic_model_log_errors(np.ones(3), np.ones(3))[0]))
