"""Tile-and-wave structure: wave quantisation, per-SM roofline, L2, bounded utilisation."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.cost import features, tiling


def one(value: float) -> np.ndarray:
    return np.array([float(value)])


def gemm_ms(m: int, n: int, k: int, *, sms: float = 80, peak_gflops: float = 14_000,
            bw_gbps: float = 900, l2_mb: float = 6, clock_mhz: float = 1370,
            tensor_core: bool = False) -> dict[str, np.ndarray]:
    unique = one(4.0 * (m * k + k * n + m * n))
    return tiling.gemm_plan(one(1), one(m), one(n), one(k), one(4), np.array([tensor_core]),
                            unique, one(peak_gflops), one(bw_gbps), one(sms), one(l2_mb),
                            one(clock_mhz))


def test_waves_are_tiles_over_the_sms_rounded_up() -> None:
    plan = gemm_ms(128 * 80, 128, 4096)  # 80 tiles of 128x128: one full wave on 80 SMs
    assert plan["tile_m"][0] == 128 and plan["tile_n"][0] == 128
    assert plan["tiles"][0] == 80 and plan["waves"][0] == 1
    # At a fixed tile, one more tile needs a second wave on the same SMs...
    args = (one(2 * 128 * 128 * 4096), one(1e3), one(1), one(14_000), one(900), one(80))
    t80, w80 = tiling.wave_time_ms(one(80), *args)
    t81, w81 = tiling.wave_time_ms(one(81), *args)
    assert (w80[0], w81[0]) == (1, 2) and t81[0] == pytest.approx(2 * t80[0])
    # ...so the planner takes smaller tiles or splits K instead, paying less than a wave.
    two = gemm_ms(128 * 81, 128, 4096)
    assert plan["time_ms"][0] < two["time_ms"][0] < 1.5 * plan["time_ms"][0]


def test_per_sm_roofline_scales_with_sms_peak_and_bandwidth() -> None:
    """A GPU with twice the SMs, peak and bandwidth runs a many-wave GEMM in half the time."""
    small = gemm_ms(8192, 8192, 8192, l2_mb=0.001)
    big = gemm_ms(8192, 8192, 8192, sms=160, peak_gflops=28_000, bw_gbps=1800, l2_mb=0.001,
                  clock_mhz=1370)
    assert big["time_ms"][0] == pytest.approx(small["time_ms"][0] / 2, rel=0.02)
    # Compute-bound: the time is at least the device roofline's FLOPs / peak.
    assert small["time_ms"][0] >= 2 * 8192**3 / 14_000e6


def test_a_small_gemm_splits_k_or_takes_small_tiles_to_fill_the_gpu() -> None:
    plan = gemm_ms(64, 64, 65536)
    assert plan["split_k"][0] > 1 or plan["tile_m"][0] < 128
    assert plan["tiles"][0] > 1


def test_a_working_set_in_l2_streams_faster_than_dram() -> None:
    nbytes, elems = one(8e6), one(1e6)
    args = {"peak_gflops": one(14_000), "bw_gbps": one(900), "sms": one(80),
            "clock_mhz": one(1370)}
    in_l2 = tiling.streaming_plan(elems, elems, False, elems, nbytes, l2_mb=one(40), **args)
    in_dram = tiling.streaming_plan(elems, elems, False, elems, nbytes, l2_mb=one(1e-6), **args)
    assert in_l2["time_ms"][0] < in_dram["time_ms"][0]
    # DRAM bandwidth, plus the tail wave's quantisation.
    assert 8e6 / 900e6 <= in_dram["time_ms"][0] <= 1.05 * 8e6 / 900e6


def test_few_blocks_get_only_their_sms_share_of_bandwidth() -> None:
    """One block on an 80-SM GPU streams at 1/80 of the bandwidth (no L2 help)."""
    args = {"peak_gflops": one(14_000), "bw_gbps": one(900), "sms": one(80),
            "l2_mb": one(1e-6), "clock_mhz": one(1370)}
    few = tiling.streaming_plan(one(512), one(512), False, one(512), one(4096), **args)
    assert few["time_ms"][0] == pytest.approx(4096 / (900e6 / 80), rel=1e-3)


def test_plan_features_are_finite_and_fill_is_a_fraction() -> None:
    t4 = devices.load_catalog().resolve("t4")
    for kernel in ("gemm", "conv2d", "softmax", "elementwise", "layernorm", "pool", "memcpy"):
        n = 5
        dims = {k: np.full(n, 3 if "kernel" in k or "stride" in k else 1, dtype=np.int64)
                for k in features.KERNEL_DIMS[kernel]}
        for k in dims:
            if k in ("m", "n", "k", "rows", "cols", "c_in", "c_out", "h", "w", "elements",
                     "channels"):
                dims[k] = np.array([7, 64, 300, 1024, 5000], dtype=np.int64)
        if kernel == "conv2d":
            dims["pad_h"] = dims["pad_w"] = np.ones(n, dtype=np.int64)
        dtype = np.full(n, "float32")
        cols = features.WorkColumns(kernel, dims, dtype, np.full(n, "add"))
        dev = features.broadcast_device(t4, dtype, 0)
        x, base = features.feature_matrix(cols, dev)
        x_t, base_t = features.transfer_matrix(cols, dev, x, base, "tiled")
        names = features.transfer_feature_names(kernel, "tiled")
        assert x_t.shape == (n, len(names)) and np.isfinite(x_t).all(), kernel
        assert (base_t > features.LAUNCH_FLOOR_MS["gpu"]).all()
        fill = x_t[:, names.index("t_wave_fill")]
        assert ((fill > 0) & (fill <= 1)).all(), kernel


def test_tiled_transfer_features_hold_no_absolute_spec_or_time() -> None:
    for kernel in ("gemm", "conv2d", "softmax", "elementwise"):
        seen = set(features.transfer_feature_names(kernel, "tiled"))
        assert not seen & features.TRANSFER_EXCLUDED
        assert not seen & {"log_base_ms", "t_log_struct_ms", "t_log_ws_over_l2"}
        assert "t_wave_fill" in seen
        assert not {n for n in seen if n.startswith("t_")} - set(tiling.TRANSFER_FEATURES)
        # The "roofline" transfer model (older bundles) keeps its columns.
        names = features.feature_names(kernel)
        assert features.transfer_feature_names(kernel, "roofline") == tuple(
            names[i] for i in features.transfer_columns(kernel))
    # "tiled-gemm": the structure for gemm, the roofline for the other kernels.
    assert features.transfer_feature_names("gemm", "tiled-gemm") == \
        features.transfer_feature_names("gemm", "tiled")
    for kernel in ("conv2d", "softmax"):
        assert features.transfer_feature_names(kernel, "tiled-gemm") == \
            features.transfer_feature_names(kernel, "roofline")
    with pytest.raises(errors.InvalidRequestError, match="unknown transfer kind"):
        features.transfer_feature_names("gemm", "magic")


def test_utilisation_is_bounded_for_the_tiled_kind() -> None:
    ratios = np.log(np.array([0.5, 1.0, 2.0]))  # latency / base: utilisation 2, 1, 0.5
    bounded = features.bounded_log_ratio("gemm", ratios, "tiled")
    np.testing.assert_allclose(np.exp(bounded), [1.0, 1.0, 2.0])
    # Winograd convs may beat the direct-conv FLOP count; the roofline kind is left alone.
    assert np.exp(features.bounded_log_ratio("conv2d", ratios, "tiled"))[0] == pytest.approx(0.5)
    np.testing.assert_array_equal(features.bounded_log_ratio("gemm", ratios, "roofline"), ratios)


def test_transfer_base_is_the_structure_plus_the_launch_floor() -> None:
    catalog = devices.load_catalog()
    n = 3
    dims = {"batch": np.ones(n, dtype=np.int64), "m": np.array([64, 1024, 8192]),
            "k": np.array([64, 1024, 8192]), "n": np.array([64, 1024, 8192]),
            "bias": np.zeros(n, dtype=np.int64)}
    dtype = np.full(n, "float32")
    cols = features.WorkColumns("gemm", dims, dtype, np.full(n, "gemm"))
    bases = {}
    for key in ("a100-pcie-40gb", "a100-pcie-80gb", "h100-sxm-80gb"):
        dev = features.broadcast_device(catalog.resolve(key), dtype, 0)
        x, base = features.feature_matrix(cols, dev)
        _, tb = features.transfer_matrix(cols, dev, x, base, "tiled")
        assert (tb >= features.LAUNCH_FLOOR_MS["gpu"]).all()
        np.testing.assert_array_equal(features.transfer_matrix(cols, dev, x, base, "roofline")[1],
                                      base)
        bases[key] = tb
    # A GPU at least as good on every spec is never slower in the structure.
    assert (bases["a100-pcie-80gb"] <= bases["a100-pcie-40gb"]).all()
    assert (bases["h100-sxm-80gb"] <= bases["a100-pcie-40gb"]).all()
    # More SMs at the same per-SM rates: a many-wave GEMM gets faster.
    a100 = catalog.resolve("a100-pcie-40gb")
    bigger = dataclasses.replace(a100, sm_count=216, mem_bandwidth_gbps=2 * 1555,
                                 peak_tflops={"fp32": 2 * 19.492})
    dev2 = features.broadcast_device(bigger, dtype, 0)
    x2, b2 = features.feature_matrix(cols, dev2)
    assert features.transfer_matrix(cols, dev2, x2, b2, "tiled")[1][2] < bases["a100-pcie-40gb"][2]
