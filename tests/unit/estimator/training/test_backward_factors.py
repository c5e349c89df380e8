"""Backward factors from forward+backward timings: the ratio rules and the row filters."""

from __future__ import annotations

import pandas as pd
import pytest

from gpuplan_estimator.training import backward_factors


def rows(kernel: str, op: str, fwd_ms: float, fwd_bwd_ms: float, n: int,
         backend: str = "torch-cpu") -> pd.DataFrame:
    return pd.DataFrame({"backend": [backend] * n, "kernel": [kernel] * n, "op": [op] * n,
                         "latency_ms": [fwd_ms] * n, "fwd_bwd_latency_ms": [fwd_bwd_ms] * n})


def test_factor_is_measured_backward_over_derived_passes() -> None:
    frame = pd.concat([
        rows("conv2d", "conv", 1.0, 4.0, 25),  # backward 3.0 over 2 derived passes: 1.5
        rows("elementwise", "relu", 0.2, 0.5, 25),  # 0.3 over 1 pass: 1.5
        rows("elementwise", "mul", 0.2, 0.6, 25),  # 0.4 over 2 passes: 1.0
        rows("softmax", "softmax", 1.0, 1.8, 25, backend="other-cpu"),
    ])
    got = backward_factors.fit(frame)
    assert got["torch-cpu"]["conv"] == pytest.approx(1.5)
    assert got["torch-cpu"]["elementwise"] == pytest.approx(1.25)  # median of 1.5s and 1.0s
    assert got["other-cpu"] == {"softmax": pytest.approx(0.8)}


def test_tiny_pass_through_and_sparse_rows_fit_nothing() -> None:
    frame = pd.concat([
        rows("conv2d", "conv", 0.01, 0.1, 50),  # below MIN_FORWARD_MS
        rows("elementwise", "add", 1.0, 1.2, 50),  # Add's backward is free: no derived pass
        rows("gemm", "matmul", 1.0, 4.0, backward_factors.MIN_ROWS - 1),
    ])
    assert backward_factors.fit(frame) == {}
    assert backward_factors.fit(frame.drop(columns="fwd_bwd_latency_ms")) == {}


def test_onnxruntime_rows_without_backward_are_ignored() -> None:
    frame = pd.concat([rows("gemm", "matmul", 1.0, 5.0, 30),
                       rows("gemm", "matmul", 1.0, float("nan"), 30, backend="ort-cpu")])
    assert backward_factors.fit(frame) == {"torch-cpu": {"matmul": pytest.approx(2.0)}}


@pytest.mark.parametrize(("kernel", "op", "passes"), [
    ("conv2d", "conv", 2.0), ("gemm", "matmul", 2.0), ("layernorm", "layernorm", 2.0),
    ("softmax", "softmax", 1.0), ("pool", "maxpool", 1.0), ("elementwise", "sub", 1.0),
    ("elementwise", "addu", 0.0), ("elementwise", "mulu", 1.0), ("elementwise", "gelu", 1.0),
])
def test_derived_passes_follow_the_backward_rules(kernel: str, op: str, passes: float) -> None:
    assert backward_factors.derived_passes(kernel, op) == passes
