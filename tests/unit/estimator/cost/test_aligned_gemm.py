"""Aligned tensor-core GEMMs priced by their tile-and-wave plan at a utilisation fitted on
profiled steps (issue #30): which GEMMs are aligned, what the price is, how the fit is made and
held out, and the learned predictor applying it where the bundle's manifest holds one."""

from __future__ import annotations

import dataclasses
import math
import pickle
from types import MappingProxyType

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors, workload
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost import aligned_gemm, features, tiling
from gpuplan_estimator.latency import learned, selection
from gpuplan_estimator.training import stream_fit

H200 = devices.resolve_device("h200-sxm-141gb")
FIT = aligned_gemm.AlignedGemmFit({"half": math.log(0.6), "tf32": math.log(0.5)}, 0.2)


def gemm_cols(shapes: list[tuple[int, int, int]], dtype: str, math_mode: str = ""
              ) -> features.WorkColumns:
    arr = np.array(shapes, dtype=np.int64)
    n = len(arr)
    dims = {"batch": np.ones(n, dtype=np.int64), "m": arr[:, 0], "k": arr[:, 1],
            "n": arr[:, 2], "bias": np.zeros(n, dtype=np.int64)}
    return features.WorkColumns("gemm", dims, np.full(n, dtype), np.full(n, "matmul"),
                                np.full(n, math_mode))


def on(spec: devices.DeviceSpec, cols: features.WorkColumns) -> features.DeviceColumns:
    return features.broadcast_device(spec, cols.dtype, 0, "gemm", cols.math)


def forward(cols: features.WorkColumns) -> list[str]:
    return [aligned_gemm.FORWARD] * len(cols)


def test_a_gemms_class_is_its_mode_and_the_alignment_under_a_whole_vector() -> None:
    dims = np.array([[2048, 768, 50257], [2048, 768, 30522], [2048, 768, 3072]], dtype=float)
    elements = tiling.alignment_elements(dims[:, 0], dims[:, 1], dims[:, 2], np.full(3, 2.0))
    assert elements.tolist() == [1.0, 2.0, 8.0]
    assert [tiling.tensor_core_class("half", int(e), 2) for e in elements] == [
        "half-align1", "half-align2", "half"]
    assert tiling.tensor_core_class("", 8, 2) == ""
    cols = gemm_cols([(2048, 768, 50257), (2048, 768, 3072), (64, 100, 64)], "bfloat16")
    classes, _ = features.tensor_core_gemm(cols, on(H200, cols))
    assert classes.tolist() == ["half-align1", "half", "half-align4"]
    # an unaligned GEMM is priced only at a vocabulary's size; an aligned one at any
    assert aligned_gemm.priced_classes(classes, cols).tolist() == [True, True, False]


def test_a_tensor_core_gemm_is_aligned_when_every_dim_holds_whole_16_byte_vectors() -> None:
    dims = np.array([[2048, 1024, 4096], [2048, 1024, 50257], [2044, 1024, 4096]], dtype=float)
    def classes(mode: str, width: int) -> list[str]:
        elements = tiling.alignment_elements(dims[:, 0], dims[:, 1], dims[:, 2],
                                             np.full(3, float(width)))
        return [tiling.tensor_core_class(mode, int(e), width) for e in elements]

    # 2044 is no multiple of 8 halves
    assert classes("half", 2) == ["half", "half-align1", "half-align4"]
    assert classes("tf32", 4) == ["tf32", "tf32-align1", "tf32"]  # but of 4 floats


def test_a_tf32_gemm_of_two_floats_alignment_runs_the_align1_kernels() -> None:
    """BERT's vocabulary head (30,522 = 2 x 15,261): cuBLAS ran `_align2` kernels in bf16 and
    `_align1` ones in tf32 (H200 profiles), so the tf32 head is priced as GPT-2's is."""
    assert tiling.tensor_core_class("tf32", 2, 4) == "tf32-align1"
    assert tiling.tensor_core_class("tf32", 1, 4) == "tf32-align1"
    assert tiling.tensor_core_class("half", 2, 2) == "half-align2"
    cols = gemm_cols([(2048, 768, 30522)], "float32", "tf32")
    classes, _ = features.tensor_core_gemm(cols, on(H200, cols))
    assert classes.tolist() == ["tf32-align1"]
    assert aligned_gemm.priced_classes(classes, cols).tolist() == [True]
    modes = tiling.tensor_core_mode(np.array(["bfloat16", "float16", "float32", "float32"]),
                                    np.array(["", "", "tf32", ""]))
    assert modes.tolist() == ["half", "half", "tf32", ""]


def test_an_aligned_gemm_costs_its_plan_over_the_utilisation_of_its_mode() -> None:
    cols = gemm_cols([(2048, 1024, 4096), (2048, 1024, 50257)], "bfloat16")
    dev = on(H200, cols)
    mask, (median, p10, p90) = aligned_gemm.price(cols, forward(cols), H200, dev, FIT)
    assert mask.tolist() == [True, False]  # FIT holds no "half-align1": the learned price
    _, plan_ms = features.tensor_core_gemm(cols, dev)
    assert median[0] == pytest.approx(plan_ms[0] / 0.6)
    spread = math.exp(aligned_gemm.Z90 * 0.2)
    assert (p10[0], p90[0]) == pytest.approx((median[0] / spread, median[0] * spread))
    # 17 GFLOP at 60 % of the 989 TFLOP/s bf16 peak, wave tails aside: about 29 us
    assert 0.025 < median[0] < 0.045


def test_plain_fp32_and_modes_the_fit_or_the_gpu_lacks_are_left_alone() -> None:
    ieee = gemm_cols([(2048, 1024, 4096)], "float32")
    assert not aligned_gemm.price(ieee, forward(ieee), H200, on(H200, ieee), FIT)[0].any()
    tf32 = gemm_cols([(2048, 1024, 4096)], "float32", "tf32")
    assert aligned_gemm.price(tf32, forward(tf32), H200, on(H200, tf32), FIT)[0].all()
    half_only = aligned_gemm.AlignedGemmFit({"half": 0.0}, 0.0)
    assert not aligned_gemm.price(tf32, forward(tf32), H200, on(H200, tf32), half_only)[0].any()
    v100 = devices.resolve_device("v100-sxm2-32gb")  # no tf32 on its spec sheet
    assert not aligned_gemm.price(tf32, forward(tf32), v100, on(v100, tf32), FIT)[0].any()
    assert not aligned_gemm.prices_device(devices.resolve_device("mi300x"))
    assert aligned_gemm.prices_device(H200)


def test_a_tiny_aligned_gemm_costs_at_least_the_shortest_stream_kernel() -> None:
    cols = gemm_cols([(8, 8, 8)], "bfloat16")
    _, (median, _, _) = aligned_gemm.price(cols, forward(cols), H200, on(H200, cols), FIT)
    assert median[0] == pytest.approx(aligned_gemm.MIN_KERNEL_MS)


@pytest.mark.parametrize("doc, field", [
    ({"log_sigma": 0.1}, "log_util"),
    ({"log_util": {"half": "fast"}, "log_sigma": 0.1}, "log_util.half"),
    ({"log_util": {"half": 0.1}, "log_sigma": -1.0}, "log_sigma"),
    ({"log_util": {"half": 0.1}, "log_sigma": float("nan")}, "log_sigma"),
])
def test_a_bad_manifest_entry_names_its_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(errors.InvalidRequestError, match=field):
        aligned_gemm.AlignedGemmFit.from_json(doc)
    assert aligned_gemm.AlignedGemmFit.from_json(FIT.to_json()) == FIT
    assert pickle.loads(pickle.dumps(FIT)) == FIT  # the service pickles predictors


@pytest.mark.parametrize("name, mode, dtype, cls", [
    ("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_bias_NNT", "half", "bfloat16", "half"),
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32", "tf32", "float32", "tf32"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align4>", "tf32",
     "float32", "tf32"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x256_32x3_tn_align1>", "tf32",
     "float32", "tf32-align1"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_nn_align4", "half", "bfloat16",
     "half-align4"),
    ("cutlass_75_tensorop_bf16_s1688gemm_bf16_128x128_tn_align2", "half", "bfloat16",
     "half-align2"),
    ("fmha_cutlassF_f32_aligned_64x64_rf_sm80", "tf32", "float32", None),
    ("void at::native::vectorized_elementwise_kernel<4>", "half", "bfloat16", None),
])
def test_profiled_kernels_are_sorted_by_their_names(name: str, mode: str, dtype: str,
                                                     cls: str | None) -> None:
    assert stream_fit.kernel_class(name, mode, dtype) == cls


def row(group: str, mode: str, ratio: float) -> stream_fit.AlignedRow:
    return stream_fit.AlignedRow(group, mode, "forward", plan_ms=ratio, profiled_ms=1.0)


def test_the_fit_is_the_median_ratio_per_mode_and_its_spread_is_held_out() -> None:
    rows = [row("a", "half", 0.5), row("b", "half", 0.6), row("c", "half", 0.8),
            row("a", "tf32", 0.4), row("b", "tf32", 0.5)]
    fitted = stream_fit.fit(rows)
    assert fitted.log_util["half"] == pytest.approx(math.log(0.6))
    assert fitted.log_util["tf32"] == pytest.approx(np.median(np.log([0.4, 0.5])))
    folds = stream_fit.leave_one_group_out(rows)
    assert folds["c"].log_util["half"] == pytest.approx(np.median(np.log([0.5, 0.6])))
    assert "tf32" not in folds["c"].log_util or folds["c"].log_util["tf32"] == pytest.approx(
        fitted.log_util["tf32"])
    assert folds["a"].log_util["tf32"] == pytest.approx(math.log(0.5))
    shipped = stream_fit.fit_for_bundle(rows)
    assert shipped.log_util == fitted.log_util
    held_out = [math.log(r.plan_ms) - folds[r.group].log_util[r.kernel_class] for r in rows]
    assert shipped.log_sigma == pytest.approx(float(np.sqrt(np.mean(np.square(held_out)))))
    with pytest.raises(ValueError, match="no profiled phase"):
        stream_fit.fit([row("a", "half", 0.0)])


def test_a_class_reads_its_phases_own_utilisation_where_profiles_held_that_phase() -> None:
    """GPT-2's bf16 vocabulary head ran 128x128 tiles forward and 256x128 backward (H200,
    profiled): 1.5x apart at one class, so each phase gets its own figure and the class's
    over both phases stands in for a phase no profile held."""
    backward = [dataclasses.replace(r, phase=aligned_gemm.BACKWARD)
                for r in (row("a", "half", 0.9), row("b", "half", 0.8))]
    rows = [row("a", "half", 0.5), row("b", "half", 0.6), *backward, row("a", "tf32", 0.4)]
    fitted = stream_fit.fit(rows)
    assert fitted.log_util_of("half", aligned_gemm.FORWARD) == pytest.approx(
        np.median(np.log([0.5, 0.6])))
    assert fitted.log_util_of("half", aligned_gemm.BACKWARD) == pytest.approx(
        np.median(np.log([0.9, 0.8])))
    assert fitted.log_util_of("half", "other") == pytest.approx(
        np.median(np.log([0.5, 0.6, 0.9, 0.8])))
    assert fitted.log_util_of("tf32", aligned_gemm.BACKWARD) == pytest.approx(math.log(0.4))
    assert math.isnan(fitted.log_util_of("half-align1", aligned_gemm.FORWARD))
    # priced per phase: the same GEMM backward at its backward utilisation
    cols = gemm_cols([(2048, 1024, 4096), (2048, 1024, 4096)], "bfloat16")
    phases = [aligned_gemm.FORWARD, aligned_gemm.BACKWARD]
    _, (median, _, _) = aligned_gemm.price(cols, phases, H200, on(H200, cols), fitted)
    assert median[0] / median[1] == pytest.approx(
        math.exp(fitted.log_util_of("half", aligned_gemm.BACKWARD)
                 - fitted.log_util_of("half", aligned_gemm.FORWARD)))
    with pytest.raises(ValueError, match="1 phases for 2 gemm rows"):
        aligned_gemm.price(cols, phases[:1], H200, on(H200, cols), fitted)
    assert aligned_gemm.fit_phase(Phase.BACKWARD) == aligned_gemm.BACKWARD
    assert aligned_gemm.fit_phase(Phase.FORWARD) == aligned_gemm.FORWARD


def gemm_item(m: int, k: int, n: int, dtype: str, **attributes: object) -> WorkItem:
    flops = 2 * m * k * n
    return WorkItem(layer=f"l{m}x{k}x{n}", family=OpFamily.MATMUL, kernel="gemm",
                    phase=Phase.FORWARD, dims=MappingProxyType({"batch": 1, "m": m, "k": k,
                                                                "n": n, "bias": 0}),
                    dtype=dtype, flops=flops, bytes_moved=2 * (m * k + k * n + m * n),
                    op="MatMul", role="fwd", attributes=MappingProxyType(dict(attributes)))


@pytest.fixture(scope="module")
def shipped() -> learned.LearnedPredictor:
    bounded, source = selection.select_predictor(None, None)
    predictor = getattr(bounded, "inner", bounded)
    if not isinstance(predictor, learned.LearnedPredictor):
        pytest.fail(f"the shipped bundle did not load: {source}")
    return predictor


def test_a_sibling_bounded_predictor_stays_bounded_with_another_fit() -> None:
    bounded, _ = selection.select_predictor(None, None)
    other = bounded.with_aligned_gemm(None)
    assert type(other) is type(bounded) and other.inner.aligned_fit is None


def test_the_predictor_prices_aligned_gemms_by_the_fit_its_manifest_holds(
        shipped: learned.LearnedPredictor) -> None:
    manifest = {k: v for k, v in shipped.bundle.manifest.items()
                if k != aligned_gemm.MANIFEST_KEY}
    without = learned.LearnedPredictor(dataclasses.replace(shipped.bundle, manifest=manifest))
    assert without.aligned_fit is None
    with_fit = learned.LearnedPredictor(dataclasses.replace(
        shipped.bundle, manifest={**manifest, aligned_gemm.MANIFEST_KEY: FIT.to_json()}))
    assert with_fit.aligned_fit == FIT
    items = [gemm_item(2048, 1024, 4096, "bfloat16"), gemm_item(2048, 1024, 50257, "bfloat16"),
             gemm_item(2048, 64, 2048, "bfloat16", **{workload.FUSED_IO_BYTES: 10})]
    before, after = without.predict(items, H200), with_fit.predict(items, H200)
    assert after.predictor[0] == aligned_gemm.LABEL
    cols = features.columns_from_items("gemm", items[:1])
    _, (expected, _, _) = aligned_gemm.price(cols, forward(cols), H200, on(H200, cols), FIT)
    assert after.median_ms[0] == pytest.approx(expected[0])
    # the unaligned GEMM and the fused core's GEMM keep what the bundle's model says
    assert after.median_ms[1:].tolist() == pytest.approx(before.median_ms[1:].tolist())
    assert after.predictor[1:] == before.predictor[1:]
    held_out = with_fit.with_aligned_gemm(None)
    assert held_out.predict(items, H200).median_ms.tolist() == pytest.approx(
        before.median_ms.tolist())


def test_gemms_priced_by_the_fit_err_together_by_its_spread_in_a_steps_interval() -> None:
    from gpuplan_estimator import graph
    from gpuplan_estimator.graph import zoo
    from gpuplan_estimator.planning import estimates
    from gpuplan_estimator.step.decomposition import TrainingSettings

    config = {"model_type": "gpt2", "n_embd": 2048, "n_head": 16, "n_layer": 2,
              "vocab_size": 1024, "n_positions": 1024}
    model = graph.load_model(zoo.build_transformer(config, name="gpt2").SerializeToString(),
                             batch=16, dim_bindings={"sequence": 1024})
    settings = TrainingSettings(batch_size=16, mode="inference", precision="bf16",
                                attention="fused")
    bounded, _ = selection.select_predictor(None, None)

    def estimate(sigma: float) -> estimates.DeviceStepEstimate:
        fit = aligned_gemm.AlignedGemmFit({"half": math.log(0.6)}, sigma)
        (r,) = estimates.estimate(model, [H200], settings,
                                  predictor=bounded.with_aligned_gemm(fit))
        return r

    tight, wide = estimate(0.0), estimate(0.5)
    assert tight.forward_ms == pytest.approx(wide.forward_ms)  # the spread moves no median
    share = wide.predictor[aligned_gemm.LABEL]
    assert share > 0.3
    # Shared, the priced GEMMs' spread adds up over their distinct shapes (independent, it
    # would shrink with their number): the step's log half-width is at least their share of it.
    half_width = math.log(wide.interval_ms[1] / wide.forward_ms)
    assert half_width >= 0.99 * aligned_gemm.Z90 * 0.5 * share


def test_a_tensor_core_gemm_is_planned_over_the_tiles_its_library_runs() -> None:
    """BERT-base's 768x768 projection over 2,048 tokens: 96 tiles of 128x128 leave 36 of the
    H200's 132 SMs idle, and cuBLAS runs it so (one wave of 128x128 `sm90_xmma` tiles, K
    whole); the general plan's 64x64 tiles or split K would fill them and price it 25 %
    faster than any profiled kernel ran."""
    for dtype, math_mode in (("float32", "tf32"), ("bfloat16", "")):
        cols = gemm_cols([(2048, 768, 768)], dtype, math_mode)
        dev = on(H200, cols)
        _, plan_ms = features.tensor_core_gemm(cols, dev)
        flops, nbytes = features.work_cost(cols)
        general = features.structure(cols, dev, flops, nbytes)
        mode = tiling.tensor_core_mode(cols.dtype, cols.math)[0]
        width = tiling.dtype_bytes_of(cols.dtype)
        d = {k: v.astype(float) for k, v in cols.dims.items()}
        library = tiling.library_gemm_plan(d["batch"], d["m"], d["n"], d["k"], width, str(mode),
                                           nbytes, dev.peak_gflops, dev.bw_gbps, dev.sm_count,
                                           np.full(1, np.inf), dev.clock_mhz)
        assert library["split_k"].tolist() == [1.0]
        assert library["tile_m"][0] * library["tile_n"][0] >= 128 * 64
        # one wave of one 128x128 tile per SM at its share of the peak
        one_tile_ms = 2 * 128 * 128 * 768 / (dev.peak_gflops[0] * 1e6 / dev.sm_count[0])
        assert plan_ms[0] == pytest.approx(one_tile_ms, rel=0.01)
        assert general["time_ms"][0] < 0.8 * plan_ms[0]


def test_a_mode_without_a_library_menu_is_refused() -> None:
    one = np.ones(1)
    with pytest.raises(ValueError, match="fp8"):
        tiling.library_gemm_plan(one, one, one, one, one, "fp8", one, one, one, one, one, one)
