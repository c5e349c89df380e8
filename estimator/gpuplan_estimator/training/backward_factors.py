"""Backward-over-derived factors per backend and op family, from forward+backward timings.

`backward` prices a layer's backward as forward-shaped kernels (a conv's dgrad and wgrad as two
convs, ...), each at the speed the forward model predicts. A backend timed with autograd
(`gpuplan bench --backend torch` stores ``fwd_bwd_latency_ms``) shows how far that is from what
it really runs: PyTorch's CPU backward kernels are slower than its forward ones, and every
autograd node adds host work. The factor per (backend, family) is the median over measured
rows of  measured backward / (derived passes x forward),  where the derived passes restate
`backward`'s rules in units of the forward kernel at the same dims.

On a GPU whose bench rows were timed this way (a `gpuplan bench` run's backend), the factors
of the families whose backward the derivation prices by forward-kernel stand-ins scale that
derived backward (`KernelFamily.backward_measured`: convolutions, batch norm, pooling;
`latency.learned.backward_factors`; their figures on the H200 run are in
docs/latency-method.md). The other families' factors, and every CPU backend's, are a check of
the derivation only. Applied
to every backward item of the light models' PyTorch CPU SGD steps they made the whole-step
error worse (21.5 % against 19.2 % MAPE over 10 rows): the isolated layer's autograd overhead
does not carry over to a whole network, whose forward is the larger miss (ResNet-50 at batch 1:
77.8 ms predicted, 99 ms measured).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from gpuplan_estimator.core import kernels

KERNEL_FAMILY: Mapping[str, str] = {
    k: f.backward_group for k, f in kernels.KERNEL_FAMILIES.items()}
"""The group each kernel's backward/forward ratio is fitted in (`core.kernels`)."""
MIN_FORWARD_MS = 0.05
"""Shorter forwards are mostly dispatch overhead; their ratio says little about large layers,
which dominate a training step."""
MIN_ROWS = 20
"""Fewer usable rows for a (backend, family) and no factor is fitted: derived pricing stays."""

_ELEMENTWISE_PASSES: Mapping[str, float] = {
    "add": 0.0, "addu": 0.0,  # dY passes through: no kernel priced, nothing to compare
    "sub": 1.0,  # negate the second operand's gradient
    "mul": 2.0, "div": 2.0, "pow": 2.0,  # one pass per operand
}


def derived_passes(kernel: str, op: str) -> float:
    """Forward-kernel passes `backward` prices for one bench unit's backward (0 = none)."""
    if kernel == "elementwise":
        return _ELEMENTWISE_PASSES.get(op, 1.0)  # unary and tensor-scalar ops: one pass
    family = kernels.KERNEL_FAMILIES.get(kernel)
    return family.backward_passes if family else 0.0  # a kernel no model prices: skipped


def fit(frame: pd.DataFrame) -> dict[str, dict[str, float]]:
    """``{backend: {family: factor}}`` from rows that carry ``fwd_bwd_latency_ms``."""
    if "fwd_bwd_latency_ms" not in frame.columns:
        return {}
    rows = frame[frame["fwd_bwd_latency_ms"].notna() & (frame["latency_ms"] >= MIN_FORWARD_MS)]
    if rows.empty:
        return {}
    passes = np.array([derived_passes(k, o) for k, o in zip(rows["kernel"], rows["op"],
                                                            strict=True)])
    usable = rows.assign(passes=passes)[passes > 0]
    ratio = ((usable["fwd_bwd_latency_ms"] - usable["latency_ms"])
             / (usable["passes"] * usable["latency_ms"]))
    usable = usable.assign(ratio=ratio, family=usable["kernel"].map(KERNEL_FAMILY))
    out: dict[str, dict[str, float]] = {}
    for (backend, family), group in usable.groupby(["backend", "family"]):
        if len(group) >= MIN_ROWS:
            out.setdefault(str(backend), {})[str(family)] = round(float(group["ratio"].median()), 3)
    return out
