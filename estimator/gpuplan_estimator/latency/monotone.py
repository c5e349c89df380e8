"""Same-architecture monotonicity: a device is never predicted slower than one it dominates.

Of two devices of one architecture, the one at least as good on every speed spec (each peak,
bandwidth, SMs, clocks, L2, TDP: `catalog.dominates_in_speed`) runs each kernel no slower: same
instructions, same memory hierarchy, more of everything. A learned model can break this where it
prices the two differently: the shipped bundle prices a measured device (V100-PCIe, A100-PCIe)
with the model that saw its rows, and an unseen sibling (V100-SXM2, A100-SXM4) with the transfer
model; the two disagree by a few per cent either way, which ranked V100-PCIe ahead of V100-SXM2.

The fix is the projection onto that constraint: each item's median, P10 and P90 on a device is
the minimum of its own and those of every device it dominates, except a device the bundle
timed, which an extrapolated sibling does not lower (its measurement is the better word). It
changes nothing where the model already agrees with the hardware, never raises a prediction,
and needs no retraining.

A sibling priced from rows timed another way is compared in the device's own timing
(`learned.kernel_timing`): a GPU a benchmark Job measured is priced from stream-timed rows, an
unseen sibling from the shared data's eager calls, which each hold one call's dispatch
(`host.EAGER_CALL_DISPATCH_MS`). Bounded by the eager figure, the measured GPU kept a kernel
that the sibling's stream, once the dispatch is taken off, ran faster.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from gpuplan_estimator.core.workload import WorkItem
from gpuplan_estimator.cost.predictors import (
    FloatArray,
    LatencyPrediction,
    LatencyPredictor,
    predict_on_each,
)
from gpuplan_estimator.devices import catalog as catalog_mod
from gpuplan_estimator.devices.catalog import Catalog, DeviceSpec
from gpuplan_estimator.latency import learned
from gpuplan_estimator.step import host


def bounded_by(own: LatencyPrediction, dominated: Sequence[LatencyPrediction]
               ) -> LatencyPrediction:
    """`own` with each item's median, P10 and P90 lowered to the least of `dominated`'s."""
    if not dominated:
        return own
    med = np.minimum.reduce([own.median_ms, *(p.median_ms for p in dominated)])
    p10 = np.minimum.reduce([own.p10_ms, *(p.p10_ms for p in dominated)])
    p90 = np.minimum.reduce([own.p90_ms, *(p.p90_ms for p in dominated)])
    # Keep P10 <= median <= P90 per item: the three minima may come from different siblings.
    return LatencyPrediction(median_ms=med, p10_ms=np.minimum(p10, med),
                             p90_ms=np.maximum(p90, med), predictor=own.predictor)


class SiblingBounded:
    """A `LatencyPredictor` whose predictions respect same-architecture dominance.

    Everything else (``name``, ``bundle`` for `basis.data_basis`, ...) is the wrapped
    predictor's, so callers see the same predictor with consistent rankings.
    """

    def __init__(self, inner: LatencyPredictor, catalog: Catalog) -> None:
        self.inner = inner
        self.catalog = catalog
        self.name = inner.name

    def __getattr__(self, attr: str) -> Any:
        # Only reached for attributes this wrapper lacks: those are the inner predictor's.
        # `inner` itself is absent only mid-unpickling; looking it up again would recurse.
        if attr == "inner":
            raise AttributeError(attr)
        return getattr(self.inner, attr)

    def with_aligned_gemm(self, fit: Any) -> SiblingBounded:
        """The inner predictor with another aligned-GEMM utilisation
        (`LearnedPredictor.with_aligned_gemm`), bounded as this one is."""
        return SiblingBounded(self.inner.with_aligned_gemm(fit),  # type: ignore[attr-defined]
                              self.catalog)

    def predict(self, items: Sequence[WorkItem], device: DeviceSpec) -> LatencyPrediction:
        """The inner prediction on `device`, bounded by those of the devices it dominates."""
        return self.predict_many(items, [device])[0]

    def predict_many(self, items: Sequence[WorkItem], devices: Sequence[DeviceSpec]
                     ) -> list[LatencyPrediction]:
        """Each device's bounded prediction; every device involved is priced once."""
        siblings = {d.key: [s for s in catalog_mod.dominated_siblings(self.catalog, d)
                            if self._may_bound(d, s)]
                    if d.vendor != "cpu" else () for d in devices}
        involved = {d.key: d for d in devices}
        for sibs in siblings.values():
            involved.update((s.key, s) for s in sibs)
        keys = list(involved)
        priced = dict(zip(keys, predict_on_each(self.inner, items, [involved[k] for k in keys]),
                          strict=True))
        timing = {k: learned.kernel_timing(self.inner, involved[k]) for k in keys}
        return [bounded_by(priced[d.key], [in_timing(priced[s.key], timing[s.key],
                                                     timing[d.key]) for s in siblings[d.key]])
                for d in devices]

    def _may_bound(self, device: DeviceSpec, sibling: DeviceSpec) -> bool:
        """Whether `sibling`'s figures may lower `device`'s: not where the bundle timed the
        device and only extrapolates the sibling. The measurement is the better word there;
        an H200 bounded by a transferred H100 inherited its too-fast tensor-core GEMMs."""
        bundle = getattr(self.inner, "bundle", None)
        if bundle is None:
            return True
        return not (bundle.has_seen(device) and not bundle.has_seen(sibling))


def in_timing(pred: LatencyPrediction, source: str, target: str) -> LatencyPrediction:
    """`pred`, made from rows of `source` timing, as rows of `target` timing would give it: the
    learned rows gain or lose the eager call's dispatch (`host.on_stream`)."""
    if source == target:
        return pred
    rows = learned.model_priced(pred.predictor)

    def convert(values: FloatArray) -> FloatArray:
        if target == host.STREAM_TIMING:
            return host.on_stream(values, rows, source)
        return np.where(rows, values + host.EAGER_CALL_DISPATCH_MS, values)

    return LatencyPrediction(median_ms=convert(pred.median_ms), p10_ms=convert(pred.p10_ms),
                             p90_ms=convert(pred.p90_ms), predictor=pred.predictor)
