"""Roofline predictor: hand-computed times, dtype fallbacks, vectorised predict."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost import roofline

CATALOG = devices.load_catalog()
T4 = CATALOG.resolve("t4")  # fp32 8.141 TFLOPS, fp16 65 TFLOPS, 320 GB/s

# 1024^3 GEMM: 2*1024^3 = 2147483648 FLOPs; fp32 operands 3 * 1024*1024 * 4 B = 12582912 B.
GEMM_FLOPS, GEMM_BYTES_FP32 = 2 * 1024**3, 3 * 1024 * 1024 * 4


def item(kernel: str = "gemm", flops: int = GEMM_FLOPS, bytes_moved: int = GEMM_BYTES_FP32,
         dtype: str = "float32", count: int = 1) -> WorkItem:
    return WorkItem(layer="l", family=OpFamily.MATMUL, kernel=kernel, phase=Phase.FORWARD,
                    dims={}, dtype=dtype, flops=flops, bytes_moved=bytes_moved, count=count)


def test_compute_bound_gemm_by_hand() -> None:
    # compute 2147483648 / 8.141e12 s = 0.2637862 ms > memory 12582912 / 320e9 s = 0.0393 ms
    ms = roofline.roofline_ms(GEMM_FLOPS, GEMM_BYTES_FP32, "float32", T4)
    assert ms == pytest.approx(0.2637862 + 0.005, rel=1e-6)


def test_memory_bound_elementwise_by_hand() -> None:
    # 4096 x 4096 fp32 add: reads 2 and writes 1 tensor = 201326592 B / 320e9 = 0.6291456 ms
    elements = 4096 * 4096
    ms = roofline.roofline_ms(elements, 3 * 4 * elements, "float32", T4)
    assert ms == pytest.approx(0.6291456 + 0.005, rel=1e-9)


def test_fp16_uses_tensor_cores_by_hand() -> None:
    # 2147483648 / 65e12 s = 0.0330382 ms; fp16 bytes 6291456 / 320e9 = 0.0197 ms
    ms = roofline.roofline_ms(GEMM_FLOPS, GEMM_BYTES_FP32 // 2, "float16", T4)
    assert ms == pytest.approx(0.0330382 + 0.005, rel=1e-5)


def test_efficiency_and_floor_settings() -> None:
    settings = roofline.RooflineSettings(launch_floor_ms=0.01, efficiency=0.5)
    ms = roofline.roofline_ms(GEMM_FLOPS, GEMM_BYTES_FP32, "float32", T4, settings=settings)
    assert ms == pytest.approx(2 * 0.2637862 + 0.01, rel=1e-6)
    assert roofline.roofline_ms(0, 0, "float32", T4) == pytest.approx(0.005)


@pytest.mark.parametrize(("settings", "field"), [
    ({"efficiency": 0.0}, "efficiency"), ({"efficiency": 1.5}, "efficiency"),
    ({"launch_floor_ms": -1.0}, "launch_floor_ms"), ({"efficiency": float("nan")}, "efficiency"),
])
def test_settings_are_validated(settings: dict[str, float], field: str) -> None:
    with pytest.raises(errors.InvalidRequestError) as info:
        roofline.RooflineSettings(**settings)
    assert info.value.field == field


@pytest.mark.parametrize(("device", "dtype", "tflops"), [
    ("t4", "float32", 8.141),
    ("t4", "tf32", 8.141),  # no TF32 on Turing: SIMT fp32
    ("a100-sxm4-40gb", "tf32", 156),
    ("a100-sxm4-40gb", "float32", 19.5),  # TF32 is opt-in, float32 means SIMT
    ("a100-sxm4-40gb", "float8", 312),  # no fp8 tensor cores: runs as fp16
    ("h100-sxm-80gb", "float8", 1978.9),
    ("h100-sxm-80gb", "bfloat16", 989.4),
    ("v100-sxm2-16gb", "bfloat16", 15.7),  # no bf16 hardware before Ampere
    ("p4", "float16", 5.699),  # GP104 fp16 is 1/64 rate; cuBLAS computes in fp32
    ("mi300x", "fp16", 1307.4),
    ("l4", "int64", 30.3),
])
def test_peak_per_dtype_and_fallbacks(device: str, dtype: str, tflops: float) -> None:
    peak = roofline.peak_flops_per_s(CATALOG.resolve(device), dtype)
    assert peak == pytest.approx(tflops * 1e12)


@pytest.mark.parametrize("dtype", ["float64", "complex64", ""])
def test_dtypes_without_a_sensible_peak_are_errors(dtype: str) -> None:
    with pytest.raises(errors.InvalidRequestError) as info:
        roofline.peak_flops_per_s(T4, dtype)
    assert info.value.field == "dtype"


def test_predict_prices_one_execution_with_no_interval() -> None:
    items = [
        item(),
        item(kernel="elementwise", flops=4096 * 4096, bytes_moved=3 * 4 * 4096 * 4096, count=7),
        item(kernel="none", flops=0, bytes_moved=10**9, dtype="float64"),  # shape-only: free
        item(dtype="float16", bytes_moved=GEMM_BYTES_FP32 // 2),
    ]
    pred = roofline.RooflinePredictor().predict(items, T4)
    expected = [0.2637862 + 0.005, 0.6291456 + 0.005, 0.0, 0.0330382 + 0.005]
    np.testing.assert_allclose(pred.median_ms, expected, rtol=1e-5)
    np.testing.assert_array_equal(pred.p10_ms, pred.median_ms)
    np.testing.assert_array_equal(pred.p90_ms, pred.median_ms)
    assert pred.predictor == ("roofline",) * 4


def test_predict_agrees_with_the_scalar_function() -> None:
    rng = np.random.default_rng(7)
    dtypes = ["float32", "float16", "bfloat16", "int64"]
    items = [item(flops=int(f), bytes_moved=int(b), dtype=dtypes[i % 4])
             for i, (f, b) in enumerate(zip(rng.integers(0, 10**12, 200),
                                            rng.integers(1, 10**10, 200), strict=True))]
    settings = roofline.RooflineSettings(launch_floor_ms=0.002, efficiency=0.7)
    for key in ("a10", "h100-pcie-80gb", "mi250"):
        device = CATALOG.resolve(key)
        pred = roofline.RooflinePredictor(settings).predict(items, device)
        scalar = [roofline.roofline_ms(it.flops, it.bytes_moved, it.dtype, device,
                                       settings=settings) for it in items]
        np.testing.assert_allclose(pred.median_ms, scalar, rtol=1e-12)


def test_empty_items() -> None:
    pred = roofline.RooflinePredictor().predict([], T4)
    assert pred.median_ms.shape == (0,) and pred.predictor == ()


def test_unsupported_dtype_in_predict_names_the_field() -> None:
    with pytest.raises(errors.InvalidRequestError, match="float64"):
        roofline.RooflinePredictor().predict([item(dtype="float64")], T4)


def test_thousands_of_items_look_up_each_peak_once_and_price_as_one_at_a_time(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The batch path is vectorised (one peak lookup per distinct dtype on a device) and gives
    each item what pricing it alone would; its speed is `make bench`'s, not a test's."""
    items = [item(flops=1000 + i, bytes_moved=4000 + i, dtype=("float32", "float16")[i % 2])
             for i in range(5000)]
    lookups: list[str] = []
    real = roofline.item_peak_flops_per_s

    def counting(device: devices.DeviceSpec, dtype: str, *rest: str) -> float:
        lookups.append(dtype)
        return real(device, dtype, *rest)

    monkeypatch.setattr(roofline, "item_peak_flops_per_s", counting)
    predictor = roofline.RooflinePredictor()
    batches = {device.key: predictor.predict(items, device).median_ms
               for device in CATALOG.devices}
    assert len(lookups) == 2 * len(CATALOG.devices)  # float32 and float16, once per device
    for device in CATALOG.devices:
        for i in (0, 1, 2_501, 4_998):
            alone = predictor.predict([items[i]], device).median_ms
            assert batches[device.key][i] == pytest.approx(alone[0], rel=1e-12)


def test_a_steps_matrix_peak_weighs_each_items_own_rate() -> None:
    """PyTorch's default fp32: convolutions on TF32 tensor cores, matmuls on the SIMT units; the
    step's peak is where their FLOPs together would take as long as each at its own rate."""
    a100 = CATALOG.resolve("a100-sxm4-80gb")
    conv = dataclasses.replace(item("conv2d", flops=3 * GEMM_FLOPS),
                               attributes=MappingProxyType({"math": "tf32"}))
    gemm, add = item("gemm", flops=GEMM_FLOPS), item("elementwise", flops=10 * GEMM_FLOPS)
    tf32 = roofline.peak_flops_per_s(a100, "tf32")
    fp32 = roofline.peak_flops_per_s(a100, "float32")
    assert roofline.matrix_peak_flops_per_s(a100, [conv], "fp32") == pytest.approx(tf32)
    mixed = roofline.matrix_peak_flops_per_s(a100, [conv, gemm, add], "fp32")
    assert mixed == pytest.approx(4 / (3 / tf32 + 1 / fp32))  # elementwise FLOPs are not counted
    assert roofline.matrix_peak_flops_per_s(a100, [add], "bf16") == pytest.approx(
        roofline.peak_flops_per_s(a100, "bf16"))  # no matrix work: the precision's own
