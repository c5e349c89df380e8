"""Dtype-converting elementwise kernels priced by the SMs' unrolled rate."""

from __future__ import annotations

from types import MappingProxyType

import numpy as np

from gpuplan_estimator import devices
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import DYNAMIC_CAST, Phase, WorkItem
from gpuplan_estimator.cost import unrolled


def item(rows: int, cols: int, marked: bool) -> WorkItem:
    return WorkItem(layer="res", family=OpFamily.ELEMENTWISE, kernel="elementwise",
                    phase=Phase.FORWARD, dims=MappingProxyType(
                        {"rows": rows, "cols": cols, "operands": 2}),
                    dtype="float32", flops=rows * cols, bytes_moved=10 * rows * cols, op="add",
                    attributes=MappingProxyType({DYNAMIC_CAST: 1} if marked else {}))


def test_a_marked_item_costs_its_elements_at_the_sms_rate() -> None:
    h200 = devices.resolve_device("h200-sxm-141gb")
    items = [item(2048, 768, True), item(2048, 768, False)]
    per_ms = unrolled.ELEMENTS_PER_SM_CYCLE * h200.sm_count * h200.boost_clock_mhz * 1e3
    floor = unrolled.floor_ms(items, h200)
    assert floor[0] == 2048 * 768 / per_ms
    assert floor[1] == 0.0
    # twice the elements, twice the floor: it is an issue rate, not a launch
    assert unrolled.floor_ms([item(4096, 768, True)], h200)[0] == 2 * floor[0]


def test_a_cpu_and_an_unprofiled_vendors_gpu_keep_their_price() -> None:
    cpu = devices.resolve_device("cpu")
    assert unrolled.floor_ms([item(2048, 768, True)], cpu).tolist() == [0.0]
    amd = devices.resolve_device("mi250")
    assert unrolled.floor_ms([item(2048, 768, True)], amd).tolist() == [0.0]


def test_floored_raises_a_price_below_the_floor_and_moves_its_interval_with_it() -> None:
    h200 = devices.resolve_device("h200-sxm-141gb")
    items = [item(2048, 3072, True), item(2048, 3072, False)]
    floor = unrolled.floor_ms(items, h200)[0]
    median = np.array([floor / 2, floor / 2])
    med, p90 = unrolled.floored(items, h200, median, 1.5 * median)
    assert med.tolist() == [floor, floor / 2]
    assert p90.tolist() == [1.5 * floor, 1.5 * floor / 2]
    above = np.array([2 * floor, 1.0])
    assert unrolled.floored(items, h200, above)[0].tolist() == [2 * floor, 1.0]
