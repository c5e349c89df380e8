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


def test_each_convolution_of_two_or_more_samples_has_a_half() -> None:
    gemm = WorkItem(layer="g", family=OpFamily.MATMUL, kernel="gemm", phase=Phase.FORWARD,
                    dims=MappingProxyType({"batch": 8, "m": 64, "k": 64, "n": 64, "bias": 0}),
                    dtype="float32", flops=1, bytes_moved=1)
    rows, pieces = batch_split.halves([conv(1), gemm, conv(7), conv(128)])
    assert rows.tolist() == [2, 3]
    assert [p.dims["batch"] for p in pieces] == [4, 64]  # ceil: two halves cover an odd batch
    assert pieces[1].flops == conv(64).flops and pieces[1].count == 1
    assert pieces[1].dims["c_in"] == 256


def test_the_bound_only_lowers_and_keeps_the_relative_width() -> None:
    median = np.array([10.0, 10.0, 5.0])
    parts = (median.copy(), median * 0.8, median * 1.3)
    batch_split.bounded(parts, np.array([0, 2]), np.array([4.0, 3.0]))
    assert parts[0].tolist() == pytest.approx([8.0, 10.0, 5.0])  # 2 x 4 < 10; 2 x 3 > 5
    assert (parts[1] / parts[0]).tolist() == pytest.approx([0.8] * 3)
    assert (parts[2] / parts[0]).tolist() == pytest.approx([1.3] * 3)


@pytest.mark.parametrize("device", ["h200-sxm-141gb", "t4", "a100-sxm4-80gb"])
def test_the_shipped_bundle_never_prices_a_batch_above_two_of_its_halves(device: str) -> None:
    predictor, _ = selection.select_predictor(None)
    spec = devices.load_catalog().resolve(device)
    shapes = [(256, 64, 56, 1), (64, 64, 56, 3), (1024, 256, 14, 1), (3, 64, 224, 7)]
    maths = [("float32", ""), ("float32", "tf32"), ("bfloat16", "")]
    for (c_in, c_out, size, k), (dtype, math) in itertools.product(shapes, maths):
        batches = [1, 2, 4, 8, 16, 32, 64, 128, 256]
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
