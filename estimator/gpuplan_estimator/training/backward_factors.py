"""Backward-over-derived factors per backend and op family, from forward+backward timings.

`backward` prices a layer's backward as forward-shaped kernels (a conv's dgrad and wgrad as two
convs, ...), each at the speed the forward model predicts. A backend timed with autograd
(`gpuplan bench --backend torch` stores ``fwd_bwd_latency_ms``) shows how far that is from what
it really runs: PyTorch's CPU backward kernels are slower than its forward ones, and every
autograd node adds host work. The factor per (backend, family) is the median over measured
rows of  measured backward / (derived passes x forward),  where the derived passes restate
`backward`'s rules in units of the forward kernel at the same dims.

The factors are a check of the derivation, recorded in the bundle manifest and the latency
report; predictions do not use them. Applied to every backward item of the light models'
PyTorch SGD steps they made the whole-step error worse (21.5 % against 19.2 % MAPE over 10
rows): the isolated layer's autograd overhead does not carry over to a whole network, whose
forward is the larger miss (ResNet-50 at batch 1: 77.8 ms predicted, 99 ms measured).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

KERNEL_FAMILY: Mapping[str, str] = {
    "conv2d": "conv", "gemm": "matmul", "pool": "pooling", "layernorm": "normalization",
    "batchnorm": "batchnorm",
    "softmax": "softmax", "elementwise": "elementwise", "memcpy": "data_movement",
}
MIN_FORWARD_MS = 0.05
"""Shorter forwards are mostly dispatch overhead; their ratio says little about large layers,
which dominate a training step."""
MIN_ROWS = 20
"""Fewer usable rows for a (backend, family) and no factor is fitted: derived pricing stays."""

# Backward passes of the bench units, in forward-kernel units (`backward`'s rules, every input
# and parameter needing a gradient as the torch bench runs them).
_KERNEL_PASSES: Mapping[str, float] = {
    "conv2d": 2.0,  # dgrad + wgrad, each a conv of the forward's FLOPs
    "gemm": 2.0,  # dA and dB
    "layernorm": 2.0,  # dX, then dgamma/dbeta
    "batchnorm": 1.0,  # the training-mode forward's two passes again
    "softmax": 1.0,
    "pool": 1.0,
    "memcpy": 1.0,
}
_ELEMENTWISE_PASSES: Mapping[str, float] = {
    "add": 0.0, "addu": 0.0,  # dY passes through: no kernel priced, nothing to compare
    "sub": 1.0,  # negate the second operand's gradient
    "mul": 2.0, "div": 2.0, "pow": 2.0,  # one pass per operand
}


def derived_passes(kernel: str, op: str) -> float:
    """Forward-kernel passes `backward` prices for one bench unit's backward (0 = none)."""
    if kernel == "elementwise":
        return _ELEMENTWISE_PASSES.get(op, 1.0)  # unary and tensor-scalar ops: one pass
    return _KERNEL_PASSES.get(kernel, 1.0)


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
