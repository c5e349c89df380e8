"""Sub-wave GEMMs priced by tile and wave quantisation (issue #30 part 5): which GEMMs fit one
wave of a GPU's SMs, what that wave costs per precision, the scale fitted on measured rows, and
the learned predictor pricing them so on a GPU it never measured."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors, measurements
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost import features, tiling
from gpuplan_estimator.latency import bundles, learned, selection
from gpuplan_estimator.training import fitting

H200 = "h200-sxm-141gb"
UNMEASURED = "h100-sxm-80gb"


def gemm_cols(shapes: list[tuple[int, int, int, int]], dtype: str = "float32",
              math: str = "") -> features.WorkColumns:
    """(batch, m, k, n) GEMMs without bias."""
    arr = np.array(shapes, dtype=np.int64)
    dims = {"batch": arr[:, 0], "m": arr[:, 1], "k": arr[:, 2], "n": arr[:, 3],
            "bias": np.zeros(len(arr), dtype=np.int64)}
    n = len(arr)
    return features.WorkColumns("gemm", dims, np.full(n, dtype), np.full(n, "matmul"),
                                np.full(n, math))


def on(key: str, cols: features.WorkColumns) -> features.DeviceColumns:
    return features.broadcast_device(devices.resolve_device(key), cols.dtype, 0, "gemm",
                                     cols.math)


def test_tf32_and_16_bit_gemms_take_tensor_core_tiles_plain_fp32_simt() -> None:
    rows = tiling.tensor_core_rows(np.array(["float32", "float32", "bfloat16", "float16"]),
                                   np.array(["", "tf32", "", ""]))
    assert rows.tolist() == [False, True, True, True]
    assert tiling.tensor_core_rows(np.array(["float32"]), None).tolist() == [False]


def test_a_bert_large_batch_2_projection_fits_one_wave_of_an_h200_a_big_one_does_not() -> None:
    # batch 2 x sequence 128 tokens through a 1024 -> 1024 projection; and 64k tokens.
    cols = gemm_cols([(1, 256, 1024, 1024), (1, 65536, 1024, 4096)])
    mask, wave_ms = features.one_wave_gemm(cols, on(H200, cols), 0.0)
    assert mask.tolist() == [True, False]
    # One wave: at most a few tiles per SM, each at the SM's share of the fp32 roofline, so
    # at least the device roofline and far below the launch floor for this size.
    flops = 2 * 256 * 1024 * 1024
    peak = features.peak_gflops(devices.resolve_device(H200), "float32", kernel="gemm") * 1e6
    floor = features.LAUNCH_FLOOR_MS["gpu"]
    assert flops / peak < wave_ms[0] - floor < 10 * flops / peak


def test_the_wave_is_priced_at_each_precisions_own_peak() -> None:
    shape = [(1, 256, 1024, 1024)]
    times = {}
    for dtype, math in (("float32", ""), ("float32", "tf32"), ("bfloat16", "")):
        cols = gemm_cols(shape, dtype, math)
        mask, wave = features.one_wave_gemm(cols, on(H200, cols), 0.0)
        assert mask[0], (dtype, math)
        times[dtype + math] = wave[0]
    assert times["bfloat16"] < times["float32tf32"] < times["float32"]


def test_the_scale_multiplies_the_wave_and_only_gemm_has_one() -> None:
    cols = gemm_cols([(1, 64, 4096, 64)])
    _, unscaled = features.one_wave_gemm(cols, on("a100-pcie-40gb", cols), 0.0)
    _, doubled = features.one_wave_gemm(cols, on("a100-pcie-40gb", cols), float(np.log(2.0)))
    assert doubled[0] == pytest.approx(2 * unscaled[0])
    # No tile beats its SM's roofline share: a negative scale counts as none.
    _, faster = features.one_wave_gemm(cols, on("a100-pcie-40gb", cols), -1.0)
    assert faster[0] == unscaled[0]
    soft = features.WorkColumns("softmax", {"rows": np.array([4]), "cols": np.array([8])},
                                np.array(["float32"]), np.array(["softmax"]))
    with pytest.raises(errors.InvalidRequestError, match="gemm"):
        features.one_wave_gemm(soft, on("t4", cols), 0.0)


def frame_of(key: str, shapes: list[tuple[int, int, int, int]], factor: float) -> pd.DataFrame:
    """Rows of `key` measured at `factor` times their unscaled one-wave time."""
    cols = gemm_cols(shapes)
    _, wave = features.one_wave_gemm(cols, on(key, cols), 0.0)
    return pd.DataFrame({
        "device": key, "backend": "b", "kernel": "gemm", "op": "matmul", "dtype": "float32",
        "dims": [measurements.dims_to_json({"batch": b, "m": m, "k": k, "n": n, "bias": 0})
                 for b, m, k, n in shapes],
        "latency_ms": factor * wave, "latency_std_ms": np.nan, "repeats": 5, "source": "t"})


SMALL = [(1, 32 * (i % 4 + 1), 256 * (i % 7 + 1), 32 * (i % 3 + 1)) for i in range(60)]


def test_fit_sub_wave_recovers_the_measured_scale_from_sub_wave_rows_only() -> None:
    big = [(8, 4096, 1024, 4096)] * 20  # many waves: must not move the scale
    frame = pd.concat([frame_of("t4", SMALL, 2.0), frame_of("v100-pcie-32gb", big, 9.0)],
                      ignore_index=True)
    fit = fitting.fit_sub_wave(frame, devices.resolve_device, ["b"])
    assert fit is not None
    assert fit["log_scale"] == pytest.approx(np.log(2.0), abs=1e-6)
    assert (fit["rows"], fit["devices"]) == (60, ["t4"])
    assert fitting.fit_sub_wave(frame_of("t4", SMALL[:10], 2.0), devices.resolve_device,
                                ["b"]) is None


def item(m: int, k: int, n: int) -> WorkItem:
    return WorkItem(layer=f"g{m}x{k}x{n}", family=OpFamily.MATMUL, kernel="gemm",
                    phase=Phase.FORWARD, dims={"batch": 1, "m": m, "k": k, "n": n, "bias": 0},
                    dtype="float32", flops=2 * m * k * n, bytes_moved=4 * (m * k + k * n + m * n),
                    op="matmul")


@pytest.fixture(scope="module")
def shipped() -> learned.LearnedPredictor:
    bounded, source = selection.select_predictor(None)
    predictor = getattr(bounded, "inner", bounded)
    if not isinstance(predictor, learned.LearnedPredictor):
        pytest.fail(f"the shipped bundle did not load: {source}")
    return predictor


def test_an_unmeasured_gpu_prices_sub_wave_gemms_as_one_wave_and_the_rest_as_before(
        shipped: learned.LearnedPredictor) -> None:
    scale = float(np.log(2.0))
    manifest = {**shipped.bundle.manifest,
                bundles.SUB_WAVE_KEY: {"log_scale": scale, "rows": 60, "devices": ["t4"]}}
    with_scale = learned.LearnedPredictor(dataclasses.replace(shipped.bundle, manifest=manifest))
    without = learned.LearnedPredictor(dataclasses.replace(
        shipped.bundle, manifest={k: v for k, v in manifest.items()
                                  if k != bundles.SUB_WAVE_KEY}))
    items = [item(256, 1024, 1024), item(65536, 1024, 4096)]
    h100 = devices.resolve_device(UNMEASURED)
    assert not shipped.bundle.has_seen(h100)
    after, before = with_scale.predict(items, h100), without.predict(items, h100)
    cols = features.columns_from_items("gemm", items[:1])
    _, expected = features.one_wave_gemm(cols, on(UNMEASURED, cols), scale)
    assert after.median_ms[0] == pytest.approx(expected[0])
    assert after.predictor[0] == learned.ONE_WAVE_LABEL
    # The interval keeps its width relative to the median.
    assert after.p90_ms[0] / after.median_ms[0] == pytest.approx(
        before.p90_ms[0] / before.median_ms[0])
    # Many waves: the transfer model as before.
    assert after.median_ms[1] == before.median_ms[1]
    assert after.predictor[1] == before.predictor[1] == "lightgbm:gemm:transfer"
    # A GPU the bundle measured keeps its own model.
    t4 = devices.resolve_device("t4")
    np.testing.assert_array_equal(with_scale.predict(items, t4).median_ms,
                                  without.predict(items, t4).median_ms)
