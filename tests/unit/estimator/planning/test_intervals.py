"""A step's interval: independent kernel shapes plus the error their family shares."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.quantiles import Z90
from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.cost.predictors import LatencyPrediction
from gpuplan_estimator.graph import examples
from gpuplan_estimator.latency import basis
from gpuplan_estimator.planning import estimates, intervals
from gpuplan_estimator.step.decomposition import TrainingSettings

SPREAD = 1.25  # each shape's P90 / median and median / P10


def _shapes(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    med = np.ones(n)
    return med, med / SPREAD, med * SPREAD


def test_without_a_shared_estimate_the_quantiles_are_summed() -> None:
    med, lo, hi = _shapes(10)
    assert intervals.step_interval(med, lo, hi, ["gemm"] * 10, None) == (lo.sum(), hi.sum())


def test_independent_shapes_narrow_the_interval_by_root_n() -> None:
    med, lo, hi = _shapes(100)
    p10, p90 = intervals.step_interval(med, lo, hi, ["gemm"] * 100, np.zeros(100))
    one_sd = math.log(SPREAD) / intervals.Z90
    assert math.log(p90 / 100) == pytest.approx(intervals.Z90 * one_sd / 10)
    assert p10 * p90 == pytest.approx(100.0**2)


def test_a_shared_family_error_does_not_average_out() -> None:
    med, lo, hi = _shapes(400)
    _p10, p90 = intervals.step_interval(med, lo, hi, ["gemm"] * 200 + ["softmax"] * 200,
                                       np.full(400, 0.3))
    # Two independent halves, each off by sigma 0.3: the step is off by 0.3 / sqrt(2) (plus
    # the shapes' own, nearly averaged-out part).
    sigma = math.log(p90 / 400) / intervals.Z90
    assert 0.3 / math.sqrt(2) < sigma < 0.3 / math.sqrt(2) + 0.01


def test_simulated_models_are_covered_near_eighty_percent() -> None:
    """Steps whose family is off by a shared N(0, 0.2) and whose shapes scatter N(0, 0.08):
    the shared-aware interval covers ~80 %, the summed quantiles far less."""
    rng = np.random.default_rng(0)
    shapes, shared, own = 40, 0.2, 0.08
    med = rng.uniform(0.1, 2.0, shapes)
    lo, hi = med * math.exp(-intervals.Z90 * own), med * math.exp(intervals.Z90 * own)
    band = intervals.step_interval(med, lo, hi, ["gemm"] * shapes, np.full(shapes, shared))
    summed = (lo.sum(), hi.sum())
    hits_band = hits_summed = 0
    trials = 4000
    for _ in range(trials):
        actual = float(np.sum(med * np.exp(rng.normal(0, own, shapes))) *
                       math.exp(rng.normal(0, shared)))
        hits_band += band[0] <= actual <= band[1]
        hits_summed += summed[0] <= actual <= summed[1]
    assert 0.75 <= hits_band / trials <= 0.85
    assert hits_summed / trials < 0.5


def test_synthetic_models_see_a_bias_and_average_out_scatter() -> None:
    rng = np.random.default_rng(1)
    actual = rng.uniform(0.05, 5.0, 5000)
    scattered = actual * np.exp(rng.normal(0, 0.3, 5000))
    biased = actual * 1.2
    assert np.sqrt(np.mean(intervals.synthetic_model_log_errors(actual, scattered) ** 2)) < 0.12
    assert intervals.synthetic_model_log_errors(actual, biased) == pytest.approx(math.log(1.2))


def test_devices_are_pooled_with_equal_weight() -> None:
    sigma = intervals.shared_log_sigma({"a": np.full(10, 0.1), "b": np.full(1000, 0.3)})
    assert sigma == pytest.approx(math.sqrt((0.01 + 0.09) / 2))
    with pytest.raises(ValueError):
        intervals.shared_log_sigma({})


def test_manifest_sigmas_read_by_basis() -> None:
    banded = intervals.SharedSigma(0.2, (0.1, None, 0.2, 0.3))
    manifest = {intervals.MANIFEST_KEY: {basis.EXTRAPOLATED: {
        "gemm": banded.to_manifest(), "softmax": 0.25}}}  # a number: a bundle before the bands
    assert intervals.manifest_sigmas(manifest, basis.EXTRAPOLATED) == {
        "gemm": banded, "softmax": intervals.SharedSigma(0.25)}
    assert intervals.manifest_sigmas(manifest, basis.MEASURED) is None
    assert intervals.manifest_sigmas({}, basis.EXTRAPOLATED) is None
    with pytest.raises(ValueError, match="by_band"):
        intervals.SharedSigma.from_manifest({"all_sizes": 0.2, "by_band": [0.1]})


def test_a_kernel_takes_the_sigma_of_its_duration_band() -> None:
    sigma = intervals.SharedSigma(0.15, (0.1, None, 0.2, 0.3))
    ms = np.array([0.01, 0.05, 0.2, 0.5, 4.9, 5.0, 80.0])
    # An edge opens the band above it; a band without rows takes the all-sizes figure.
    assert list(sigma.at(ms)) == [0.1, 0.15, 0.15, 0.2, 0.2, 0.3, 0.3]
    sds = intervals.shape_log_sigmas({"gemm": sigma}, ["gemm", "softmax", "gemm"],
                                     np.array([10.0, 10.0, 0.01]))
    assert list(sds) == [0.3, 0.0, 0.1]  # softmax has no shared sigma here


def test_band_sigmas_come_from_the_rows_of_that_band_only() -> None:
    """Long kernels off by a GPU-wide factor, short ones only scattered: the long band's sigma
    carries the factor, the short band's does not, and the all-sizes one sits between."""
    rng = np.random.default_rng(2)
    held_out = {}
    for device, factor in (("a", 1.3), ("b", 1 / 1.3), ("c", 1.25)):
        short = rng.uniform(0.01, 0.04, 400)
        long = rng.uniform(6.0, 60.0, 100)
        actual = np.concatenate([short, long])
        predicted = np.concatenate([short * np.exp(rng.normal(0, 0.05, 400)), long * factor])
        held_out[device] = (actual, predicted)
    sigma = intervals.shared_sigma(held_out)
    short_sd, _, _, long_sd = sigma.by_band
    assert short_sd is not None and long_sd is not None
    assert short_sd < 0.03 and long_sd == pytest.approx(0.25, abs=0.02)
    assert short_sd < sigma.all_sizes < long_sd
    assert sigma.by_band[1] is None and sigma.by_band[2] is None  # no rows there


class _Bundle:
    def __init__(self, manifest: Mapping[str, Any], seen: set[str]) -> None:
        self.manifest = manifest
        self.seen = seen

    def has_seen(self, device: devices.DeviceSpec) -> bool:
        return device.key in self.seen


class _Scattered:
    """The roofline with a +-25 % interval, behind a bundle-like manifest."""

    name = "scattered"

    def __init__(self, manifest: Mapping[str, Any]) -> None:
        self.bundle = _Bundle(manifest, {"t4"})

    def predict(self, items: Sequence[WorkItem], device: devices.DeviceSpec
                ) -> LatencyPrediction:
        med = roofline.RooflinePredictor().predict(items, device).median_ms
        return LatencyPrediction(med, med / SPREAD, med * SPREAD, ("scattered",) * len(items))


def test_an_unseen_device_gets_the_shared_error_and_a_measured_one_the_summed_quantiles(
) -> None:
    g = examples.resnet50(8)
    catalog = devices.load_catalog()
    t4, h100 = catalog.resolve("t4"), catalog.resolve("h100-sxm-80gb")
    with_sigma = _Scattered({intervals.MANIFEST_KEY: {basis.EXTRAPOLATED: {
        "conv2d": intervals.SharedSigma(0.25).to_manifest()}}})
    without = _Scattered({})
    s = TrainingSettings(batch_size=8, mode="train")
    a_t4, a_h100 = estimates.estimate(g, [t4, h100], s, predictor=with_sigma)
    b_t4, b_h100 = estimates.estimate(g, [t4, h100], s, predictor=without)
    assert a_t4.interval_ms == pytest.approx(b_t4.interval_ms)  # measured: quantiles summed
    assert b_h100.interval_ms[0] == pytest.approx(b_h100.step_time_ms / SPREAD)
    lo, hi = a_h100.interval_ms
    assert lo < a_h100.step_time_ms < hi
    assert hi / a_h100.step_time_ms != pytest.approx(SPREAD)  # no longer the summed quantiles
    fb_lo, fb_hi = a_h100.forward_backward_interval_ms
    assert fb_lo < a_h100.forward_ms + a_h100.backward_ms < fb_hi


def test_a_step_spread_adds_in_quadrature_to_each_side() -> None:
    low, high = intervals.with_step_spread((80.0, 150.0), 100.0, 0.1)
    assert math.log(100.0 / low) == pytest.approx(math.hypot(math.log(100 / 80), 0.1 * Z90))
    assert math.log(high / 100.0) == pytest.approx(math.hypot(math.log(1.5), 0.1 * Z90))
    assert intervals.with_step_spread((80.0, 150.0), 100.0, 0.0) == (80.0, 150.0)
    assert intervals.with_step_spread((100.0, 100.0), 100.0, 0.1) == pytest.approx(
        (100 * math.exp(-0.1 * Z90), 100 * math.exp(0.1 * Z90)))


def test_a_negative_step_spread_shrinks_each_side_in_proportion() -> None:
    low, high = intervals.with_step_spread((80.0, 150.0), 100.0, math.log(0.5))
    assert math.log(100.0 / low) == pytest.approx(0.5 * math.log(100 / 80))
    assert math.log(high / 100.0) == pytest.approx(0.5 * math.log(1.5))
    # Never narrower than MIN_STEP_SPREAD allows, and never past the median.
    low, high = intervals.with_step_spread((80.0, 150.0), 100.0, -50.0)
    assert math.log(high / 100.0) == pytest.approx(0.05 * math.log(1.5))
    assert low < 100.0 < high


def test_a_step_spread_below_the_narrowest_is_refused() -> None:
    entry = intervals.no_step_sigma()
    entry["train"]["half"] = -0.5
    assert intervals.step_sigma(entry, "manifest.step_log_sigma")["train"]["half"] == -0.5
    entry["train"]["half"] = intervals.MIN_STEP_SPREAD - 0.1
    with pytest.raises(InvalidRequestError, match=r"manifest\.step_log_sigma\.train\.half"):
        intervals.step_sigma(entry, "manifest.step_log_sigma")


def test_the_bundles_step_spread_widens_gpu_steps_of_its_kind_only() -> None:
    g = examples.resnet50(8)
    catalog = devices.load_catalog()
    gpu = catalog.resolve("h100-sxm-80gb")
    cpu = dataclasses.replace(gpu, key="cpu", vendor="cpu")  # a CPU with a GPU's rates
    only = intervals.no_step_sigma()
    only["inference"]["fp32"] = 0.2
    spread = {intervals.STEP_SIGMA_KEY: only}
    for mode, precision, widens in (("train", "fp32", False), ("inference", "fp32", True),
                                    ("inference", "bf16", False)):
        s = TrainingSettings(batch_size=8, mode=mode, precision=precision)
        wide = estimates.estimate(g, [gpu, cpu], s, predictor=_Scattered(spread))
        narrow = estimates.estimate(g, [gpu, cpu], s, predictor=_Scattered({}))
        assert wide[1].interval_ms == narrow[1].interval_ms  # a CPU: not fitted on its steps
        assert (wide[0].interval_ms[1] > narrow[0].interval_ms[1]) is widens
        assert wide[0].step_time_ms == narrow[0].step_time_ms
        # An explicit spread (a fold, or none) stands for the bundle's.
        off = estimates.estimate(g, [gpu], s, predictor=_Scattered(spread),
                                 step_log_sigma=intervals.no_step_sigma())
        assert off[0].interval_ms == narrow[0].interval_ms


def test_each_precision_takes_the_spread_of_its_gemm_math() -> None:
    assert [intervals.step_math(p) for p in ("fp32", "fp32-ieee", "tf32", "bf16", "fp16")] == [
        "fp32", "fp32", "tf32", "half", "half"]


_FULL = {"fp32": 0.1, "tf32": 0.1, "half": 0.1}


@pytest.mark.parametrize(("entry", "field"), [
    ([0.1], "manifest.step_log_sigma"),
    ({"train": _FULL}, "manifest.step_log_sigma.inference"),
    ({"train": _FULL, "inference": 0.1}, "manifest.step_log_sigma.inference"),
    ({"train": _FULL | {"tf32": -3.1}, "inference": _FULL}, "manifest.step_log_sigma.train.tf32"),
    ({"train": _FULL, "inference": _FULL | {"half": float("nan")}},
     "manifest.step_log_sigma.inference.half"),
    ({"train": _FULL | {"fp32": True}, "inference": _FULL}, "manifest.step_log_sigma.train.fp32"),
])
def test_a_broken_step_spread_is_named(entry: object, field: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        intervals.manifest_step_sigma({intervals.STEP_SIGMA_KEY: entry})
    assert caught.value.field == field
    assert intervals.manifest_step_sigma({}) is None
    assert intervals.manifest_step_sigma({intervals.STEP_SIGMA_KEY: {
        "train": _FULL, "inference": _FULL}}) == {"train": _FULL, "inference": _FULL}
