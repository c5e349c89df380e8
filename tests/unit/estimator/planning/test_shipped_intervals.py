"""The shipped bundle's step intervals: each basis gets the shared error of its held-out rows."""

from __future__ import annotations

import dataclasses
import math

import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.graph import examples
from gpuplan_estimator.latency import basis, bundles, learned
from gpuplan_estimator.planning import estimates, intervals
from gpuplan_estimator.step.decomposition import TrainingSettings


@pytest.fixture(scope="module")
def shipped() -> bundles.Bundle:
    return bundles.load_bundle(bundles.SHIPPED_BUNDLE, origin="shipped")


def test_the_shipped_manifest_has_a_sigma_for_every_transfer_model(shipped: bundles.Bundle
                                                                   ) -> None:
    """`gpuplan train` wrote it (`make interval-sigma` can rewrite the unseen GPUs' part); a
    figure far outside 0.05-0.5 would be a broken computation, not a GPU (leave-one-GPU-out op
    rows gave 0.09-0.22)."""
    for name in (basis.EXTRAPOLATED, basis.PROBED):
        sigmas = intervals.manifest_sigmas(shipped.manifest, name)
        assert sigmas is not None and set(sigmas) == set(shipped.transfer_models)
        assert all(0.05 < s.all_sizes < 0.5 for s in sigmas.values())
        assert all(b is None or 0.02 < b < 0.5 for s in sigmas.values() for b in s.by_band)
        # Whole models run mostly in long kernels, which a GPU's sustained clock sets.
        assert all(s.by_band[-1] is None or s.by_band[-1] > s.all_sizes
                   for s in sigmas.values())
    # A timed GPU's figure comes from the random split's held-out shapes: below the unseen's.
    measured = intervals.manifest_sigmas(shipped.manifest, basis.MEASURED)
    unseen = intervals.manifest_sigmas(shipped.manifest, basis.EXTRAPOLATED)
    assert measured is not None and unseen is not None
    assert set(measured) == set(shipped.models)
    assert all(0.0 < measured[k].all_sizes < unseen[k].all_sizes for k in unseen)
    record = shipped.manifest.get("interval_log_sigma_provenance") or shipped.manifest
    assert record["command"].startswith(("hack/bundle_interval_sigma.py", "gpuplan train"))


def test_each_basis_interval_follows_its_shared_sigma(
        shipped: bundles.Bundle) -> None:
    catalog = devices.load_catalog()
    t4, h100 = catalog.resolve("t4"), catalog.resolve("h100-sxm-80gb")
    predictor = learned.LearnedPredictor(shipped)
    s = TrainingSettings(batch_size=8, mode="train")
    g = examples.resnet50(8)
    est_t4, est_h100 = estimates.estimate(g, [t4, h100], s, predictor=predictor)
    assert est_t4.data_basis == basis.MEASURED and est_h100.data_basis == basis.EXTRAPOLATED
    before = dataclasses.replace(shipped, manifest={
        k: v for k, v in shipped.manifest.items() if k != intervals.MANIFEST_KEY})
    old_t4, old_h100 = estimates.estimate(g, [t4, h100], s,
                                          predictor=learned.LearnedPredictor(before))
    # Measured: the shared error of a timed GPU, narrower than the summed quantiles;
    # extrapolated: another interval, same median.
    assert est_t4.step_time_ms == old_t4.step_time_ms
    assert math.log(est_t4.interval_ms[1] / est_t4.interval_ms[0]) < math.log(
        old_t4.interval_ms[1] / old_t4.interval_ms[0])
    assert est_h100.step_time_ms == old_h100.step_time_ms
    assert est_h100.interval_ms != pytest.approx(old_h100.interval_ms)
    # Extrapolated: the shared errors set it: wider than half the smallest family's (one
    # family, conv2d, is over half a ResNet step), and short of a 0.5 log-sigma.
    lo, hi = est_h100.interval_ms
    sigmas = intervals.manifest_sigmas(shipped.manifest, basis.EXTRAPOLATED)
    assert sigmas is not None
    half_log = math.log(hi / lo) / 2
    smallest = min(min(b for b in (s.all_sizes, *s.by_band) if b is not None)
                   for s in sigmas.values())
    assert intervals.Z90 * 0.5 * smallest < half_log < intervals.Z90 * 0.5
    assert lo < est_h100.step_time_ms < hi
