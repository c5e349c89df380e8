"""Sibling bounds compare predictions in one timing (eager call or stream)."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplan_estimator.cost.predictors import LatencyPrediction
from gpuplan_estimator.latency import learned, monotone
from gpuplan_estimator.step import host

LEARNED = f"{learned.LABEL_PREFIX}gemm:transfer"


def prediction(*ms: float, labels: tuple[str, ...]) -> LatencyPrediction:
    values = np.array(ms)
    return LatencyPrediction(median_ms=values, p10_ms=values * 0.9, p90_ms=values * 1.1,
                             predictor=labels)


def test_an_eager_call_sibling_loses_its_dispatch_before_bounding_a_stream_timed_gpu() -> None:
    sibling = prediction(0.5, 0.5, labels=(LEARNED, "roofline"))
    seen = monotone.in_timing(sibling, host.EAGER_CALL_TIMING, host.STREAM_TIMING)
    # The learned row held one eager call's dispatch; the roofline's never did.
    assert seen.median_ms == pytest.approx([0.5 - host.EAGER_CALL_DISPATCH_MS, 0.5])
    own = prediction(0.49, 0.49, labels=(LEARNED, LEARNED))
    bounded = monotone.bounded_by(own, [seen])
    assert bounded.median_ms[0] == pytest.approx(0.5 - host.EAGER_CALL_DISPATCH_MS)
    assert bounded.median_ms[1] == pytest.approx(0.49)


def test_a_stream_timed_sibling_gains_the_dispatch_an_eager_call_figure_holds() -> None:
    sibling = prediction(0.1, labels=(LEARNED,))
    back = monotone.in_timing(sibling, host.STREAM_TIMING, host.EAGER_CALL_TIMING)
    assert back.median_ms == pytest.approx([0.1 + host.EAGER_CALL_DISPATCH_MS])
    assert monotone.in_timing(sibling, host.STREAM_TIMING, host.STREAM_TIMING) is sibling


def test_a_timed_gpu_is_not_lowered_by_a_sibling_it_only_extrapolates() -> None:
    from gpuplan_estimator import devices
    from gpuplan_estimator.latency import selection

    predictor, _ = selection.select_predictor(None)
    assert isinstance(predictor, monotone.SiblingBounded)
    catalog = devices.load_catalog()
    h200, h100 = catalog.resolve("h200-sxm-141gb"), catalog.resolve("h100-sxm-80gb")
    v100_sxm, v100_pcie = catalog.resolve("v100-sxm2-32gb"), catalog.resolve("v100-pcie-32gb")
    assert predictor.bundle.has_seen(h200) and not predictor.bundle.has_seen(h100)
    assert not predictor._may_bound(h200, h100)
    assert predictor._may_bound(v100_sxm, v100_pcie)  # extrapolated, bounded by the measured
