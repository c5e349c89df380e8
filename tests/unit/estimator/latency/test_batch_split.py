"""A convolution over a batch is never priced above two launches over its halves."""

from __future__ import annotations

import itertools
import operator
from types import MappingProxyType

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.latency import batch_split, selection
from gpuplan_estimator.step import backward


def conv(batch: int, c_in: int = 256, c_out: int = 64, size: int = 56, k: int = 1,
         dtype: str = "float32", math: str = "") -> WorkItem:
    dims = {"batch": batch, "c_in": c_in, "c_out": c_out, "h": size, "w": size,
            "kernel_h": k, "kernel_w": k, "stride_h": 1, "stride_w": 1, "pad_h": k // 2,
            "pad_w": k // 2, "dilation_h": 1, "dilation_w": 1, "groups": 1}
    flops, moved = backward.kernel_cost("conv2d", dims, 4 if dtype == "float32" else 2)
    return WorkItem(layer="c", family=OpFamily.CONV, kernel="conv2d", phase=Phase.FORWARD,
                    dims=MappingProxyType(dims), dtype=dtype, flops=flops, bytes_moved=moved,
                    op="Conv", count=3, attributes=MappingProxyType({"math": math} if math else {}))


def test_each_large_enough_convolution_has_its_halves_down_to_the_smallest() -> None:
    gemm = WorkItem(layer="g", family=OpFamily.MATMUL, kernel="gemm", phase=Phase.FORWARD,
                    dims=MappingProxyType({"batch": 64, "m": 64, "k": 64, "n": 64, "bias": 0}),
                    dtype="float32", flops=1, bytes_moved=1)
    smallest = batch_split.MIN_HALF_BATCH
    chains = batch_split.halving_chains([conv(2 * smallest - 1), gemm, conv(35), conv(128)])
    assert chains.rows == (2, 3)
    batches = [[chains.pieces[j].dims["batch"] for j in range(a, b)] for a, b in chains.chains]
    assert batches == [[18, 9], [64, 32, 16, 8]]  # ceil: the halves cover an odd batch
    half = chains.pieces[chains.chains[1][0]]
    assert half.flops == conv(64).flops and half.count == 1 and half.dims["c_in"] == 256


def test_the_bound_only_lowers_and_keeps_the_relative_width() -> None:
    chains = batch_split.halving_chains([conv(32), conv(64), conv(16)])
    median = np.array([10.0, 10.0, 5.0])
    parts = (median.copy(), median * 0.8, median * 1.3)
    # conv(32): halves 16, 8 at 4.5 and 1.0 ms: its half is bounded to 2 x 1.0, so 4 x 1.0.
    # conv(64): halves 32, 16, 8 at 9, 9, 9 ms: none binds below 2 x 9 > 10.
    # conv(16): half 8 at 3 ms: 2 x 3 > 5.
    pieces = np.array([4.5, 1.0, 9.0, 9.0, 9.0, 3.0])
    batch_split.bounded(parts, chains, pieces)
    assert parts[0].tolist() == pytest.approx([4.0, 10.0, 5.0])
    assert (parts[1] / parts[0]).tolist() == pytest.approx([0.8] * 3)
    assert (parts[2] / parts[0]).tolist() == pytest.approx([1.3] * 3)


@pytest.mark.parametrize("device", ["h200-sxm-141gb", "t4", "a100-sxm4-80gb"])
def test_the_shipped_bundle_never_prices_a_batch_above_two_of_its_halves(device: str) -> None:
    assert batch_split.MIN_HALF_BATCH == 8
    predictor, _ = selection.select_predictor(None)
    spec = devices.load_catalog().resolve(device)
    shapes = [(256, 64, 56, 1), (64, 64, 56, 3), (1024, 256, 14, 1), (3, 64, 224, 7)]
    maths = [("float32", ""), ("float32", "tf32"), ("bfloat16", "")]
    for (c_in, c_out, size, k), (dtype, math) in itertools.product(shapes, maths):
        batches = [8, 16, 32, 64, 128, 256]  # from MIN_HALF_BATCH up
        items = [conv(b, c_in, c_out, size, k, dtype, math) for b in batches]
        median = predictor.predict(items, spec).median_ms
        assert np.all(median[1:] <= 2 * median[:-1] * (1 + 1e-9)), (c_in, c_out, k, dtype)


def test_pricing_the_halves_keeps_the_callers_grouping_for_the_next_device() -> None:
    predictor, _ = selection.select_predictor(None)
    learned = predictor.inner
    catalog = devices.load_catalog()
    items = [conv(64), conv(128, k=3)]
    first = learned.predict(items, catalog.resolve("h200-sxm-141gb"))
    assert learned._cache is not None and all(map(operator.is_, learned._cache[0], items))
    groups = learned._cache[1]
    learned.predict(items, catalog.resolve("t4"))
    assert learned._cache[1] is groups  # reused, not rebuilt
    assert np.all(first.median_ms > 0)
