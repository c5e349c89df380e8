"""Feature building: shapes, cost formulas, errors, vectorised/broadcast equivalence."""

from __future__ import annotations

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost import features

DIMS = {
    "gemm": {"batch": 2, "m": 64, "k": 128, "n": 32, "bias": 0},
    "conv2d": {"batch": 1, "c_in": 3, "c_out": 8, "h": 32, "w": 32, "kernel_h": 3,
               "kernel_w": 3, "stride_h": 1, "stride_w": 1, "pad_h": 1, "pad_w": 1,
               "dilation_h": 1, "dilation_w": 1, "groups": 1},
    "pool": {"batch": 1, "channels": 8, "h": 32, "w": 32, "kernel_h": 2, "kernel_w": 2,
             "stride_h": 2, "stride_w": 2},
    "layernorm": {"rows": 128, "cols": 768},
    "batchnorm": {"rows": 128, "cols": 768},
    "softmax": {"rows": 128, "cols": 768},
    "reduce": {"rows": 128, "cols": 768},
    "elementwise": {"rows": 128, "cols": 768, "operands": 2},
    "memcpy": {"elements": 4096},
}


def item(kernel: str, dims: dict[str, int], op: str = "", dtype: str = "float32") -> WorkItem:
    return WorkItem(layer="l0", family=OpFamily.OTHER, kernel=kernel, phase=Phase.FORWARD,
                    dims=dims, dtype=dtype, flops=0, bytes_moved=0, op=op)


@pytest.fixture(scope="module")
def t4() -> devices.DeviceSpec:
    return devices.load_catalog().resolve("Tesla T4")


@pytest.mark.parametrize("kernel", sorted(features.KERNEL_DIMS))
def test_matrix_matches_names_and_is_finite(kernel: str, t4: devices.DeviceSpec) -> None:
    cols = features.columns_from_items(kernel, [item(kernel, DIMS[kernel], op="add")] * 3)
    x, base = features.feature_matrix(cols, features.broadcast_device(t4, cols.dtype, 0))
    assert x.shape == (3, len(features.feature_names(kernel)))
    assert np.isfinite(x).all()
    assert (base >= features.LAUNCH_FLOOR_MS["gpu"]).all()


def test_gemm_cost_is_2bmkn_and_operand_bytes() -> None:
    cols = features.columns_from_items("gemm", [item("gemm", DIMS["gemm"])])
    flops, nbytes = features.work_cost(cols)
    assert flops[0] == 2 * 2 * 64 * 128 * 32
    assert nbytes[0] == 4 * 2 * (64 * 128 + 128 * 32 + 64 * 32)


def test_conv_cost_uses_output_size() -> None:
    cols = features.columns_from_items("conv2d", [item("conv2d", DIMS["conv2d"])])
    flops, _ = features.work_cost(cols)
    assert flops[0] == 2 * 1 * 8 * 32 * 32 * 3 * 3 * 3  # pad 1 keeps 32x32


def test_base_grows_with_work_and_with_slower_device(t4: devices.DeviceSpec) -> None:
    a100 = devices.load_catalog().resolve("NVIDIA A100-PCIE-40GB")
    small, big = ({"rows": 64, "cols": 256}, {"rows": 8192, "cols": 4096})
    cols = features.columns_from_items("softmax", [item("softmax", small), item("softmax", big)])
    base_t4 = features.base_ms(cols, features.broadcast_device(t4, cols.dtype, 0))
    base_a100 = features.base_ms(cols, features.broadcast_device(a100, cols.dtype, 0))
    assert base_t4[1] > base_t4[0]
    assert base_t4[1] > base_a100[1]


def test_missing_dim_names_layer_and_dim() -> None:
    with pytest.raises(errors.InvalidRequestError, match=r"l0\.dims.*'n'"):
        features.columns_from_items("gemm", [item("gemm", {"batch": 1, "m": 2, "k": 3, "bias": 0})])


def test_unknown_kernel_and_dtype_are_errors(t4: devices.DeviceSpec) -> None:
    with pytest.raises(errors.InvalidRequestError, match="kernel"):
        features.columns_from_items("fft", [item("fft", {})])
    cols = features.columns_from_items("memcpy", [item("memcpy", DIMS["memcpy"], dtype="float7")])
    with pytest.raises(errors.InvalidRequestError, match="float7"):
        features.feature_matrix(cols, features.broadcast_device(t4, np.array(["float32"]), 0))


def test_broadcast_equals_per_row_device_columns(t4: devices.DeviceSpec) -> None:
    items = [item("elementwise", DIMS["elementwise"], op=op) for op in ("add", "gelu", "addu")]
    cols = features.columns_from_items("elementwise", items)
    x1, b1 = features.feature_matrix(cols, features.broadcast_device(t4, cols.dtype, 1))
    x2, b2 = features.feature_matrix(cols, features.device_columns([t4] * 3, cols.dtype, [1] * 3))
    np.testing.assert_array_equal(x1, x2)
    np.testing.assert_array_equal(b1, b2)
    op_col = features.feature_names("elementwise").index("op")
    assert x1[0, op_col] == x1[2, op_col] != x1[1, op_col]  # addu shares add's code


def test_tail_fill_is_a_fraction_of_a_wave(t4: devices.DeviceSpec) -> None:
    dims = [{"batch": 1, "m": m, "k": 64, "n": 64, "bias": 0} for m in (128, 40 * 128, 41 * 128)]
    cols = features.columns_from_items("gemm", [item("gemm", d) for d in dims])
    x, _ = features.feature_matrix(cols, features.broadcast_device(t4, cols.dtype, 0))
    fill = x[:, features.feature_names("gemm").index("tail_fill_128x64")]
    assert fill[1] == pytest.approx(1.0)  # exactly one full wave on 40 SMs
    assert 0.0 < fill[0] < 0.1 and 0.5 < fill[2] < 0.6


def test_conv_alignment_and_winograd_tiles(t4: devices.DeviceSpec) -> None:
    # 30x30 output: ceil(30/4)=8 tiles of 4x4 per side (2 rows of padding waste), 15 of 2x2.
    dims = {**DIMS["conv2d"], "batch": 2, "c_in": 12, "c_out": 40, "h": 30, "w": 30}
    cols = features.columns_from_items("conv2d", [item("conv2d", dims)])
    x, _ = features.feature_matrix(cols, features.broadcast_device(t4, cols.dtype, 0))
    row = dict(zip(features.feature_names("conv2d"), x[0], strict=True))
    assert (row["c_in_mod8"], row["c_out_mod8"], row["out_h_mod4"]) == (4.0, 0.0, 2.0)
    assert (row["c_in_mod32"], row["c_out_mod32"]) == (12.0, 8.0)
    assert row["log_wino_tiles_4x4"] == pytest.approx(np.log2(2 * 8 * 8))
    assert row["log_wino_tiles_2x2"] == pytest.approx(np.log2(2 * 15 * 15))
    assert row["log_wino_work_4x4"] == pytest.approx(np.log2(2 * 8 * 8 * 36 * 12 * 40))
    assert row["wino_pad_waste_4x4"] == pytest.approx(2 / 30)


def test_pool_op_is_a_feature_shared_by_bench_and_onnx_names(t4: devices.DeviceSpec) -> None:
    ops = ["maxpool", "MaxPool", "avgpool", "AveragePool", "GlobalAveragePool", "LpPool"]
    cols = features.columns_from_items("pool", [item("pool", DIMS["pool"], op=o) for o in ops])
    x, _ = features.feature_matrix(cols, features.broadcast_device(t4, cols.dtype, 0))
    code = x[:, features.feature_names("pool").index("pool_op")]
    assert code[0] == code[1] != code[2]
    assert code[2] == code[3] == code[4]
    assert code[5] not in (code[0], code[2])


@pytest.mark.parametrize(("op", "like"), [
    ("relu_grad", "relu"), ("gelu_grad", "gelu"), ("mulu_grad", "mul"), ("lerp", "add"),
    ("addcmul", "mul"), ("addcdiv", "div"), ("expand", "relu"), ("fused_adamw", "div")])
def test_gradient_and_optimizer_ops_take_the_code_of_their_arithmetic(
        op: str, like: str, t4: devices.DeviceSpec) -> None:
    """Not "other", whose ordinal code sits beside LRN's windowed kernel."""
    ops = [op, like, "something-unknown", "lrn"]
    cols = features.columns_from_items(
        "elementwise", [item("elementwise", DIMS["elementwise"], op=o) for o in ops])
    x, _ = features.feature_matrix(cols, features.broadcast_device(t4, cols.dtype, 0))
    code = x[:, list(features.feature_names("elementwise")).index("op")]
    assert code[0] == code[1] and code[0] != code[2] and code[0] != code[3]
