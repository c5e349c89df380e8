"""LayerLatencyModel (sklearn conventions) and LearnedPredictor (batching, fallback, speed)."""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost.roofline import RooflinePredictor
from gpuplan_estimator.devices import local_cpu
from gpuplan_estimator.latency import bundles, learned, regressors
from gpuplan_estimator.step import layout_credits

FAST: dict[str, Any] = {
    "n_estimators": 20, "num_leaves": 15, "min_child_samples": 5, "n_jobs": 1}


def synthetic_xy(n: int = 400, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, (n, 3))
    return x, 0.8 * x[:, 0] - 0.3 * x[:, 1] ** 2


def gemm_item(m: int, kernel: str = "gemm") -> WorkItem:
    dims = ({"batch": 1, "m": m, "k": 256, "n": 256, "bias": 1} if kernel == "gemm"
            else {"rows": m, "cols": 512})
    return WorkItem(layer=f"l{m}", family=OpFamily.MATMUL, kernel=kernel, phase=Phase.FORWARD,
                    dims=dims, dtype="float32", flops=2 * m * 256 * 256,
                    bytes_moved=4 * (m * 256 * 2 + 256 * 256), op="MatMul")


@pytest.fixture(scope="module")
def gemm_bundle() -> bundles.Bundle:
    """A real model on the gemm feature layout (targets from a smooth function of features)."""
    from gpuplan_estimator.cost import features

    t4 = devices.load_catalog().resolve("t4")
    items = [gemm_item(m) for m in range(8, 2048, 8)]
    cols = features.columns_from_items("gemm", items)
    x, _ = features.feature_matrix(cols, features.broadcast_device(t4, cols.dtype, 0))
    y = 0.2 + 0.1 * np.sin(x[:, features.feature_names("gemm").index("log_m")])
    model = regressors.LayerLatencyModel(**FAST).fit(x, y)
    manifest = {"backends": ["pytorch"], "default_backends": {"gpu": "pytorch"}}
    return bundles.Bundle(models={"gemm": model}, manifest=manifest)


def test_init_only_stores_and_fit_returns_self() -> None:
    model = regressors.LayerLatencyModel(n_estimators=-5)  # invalid, but only checked in fit
    assert model.n_estimators == -5 and not hasattr(model, "boosters_")
    x, y = synthetic_xy()
    with pytest.raises(errors.InvalidRequestError, match="n_estimators"):
        model.fit(x, y)
    ok = regressors.LayerLatencyModel(**FAST)
    assert ok.fit(x, y) is ok
    assert set(ok.boosters_) == {"median", "p10", "p90"} and ok.n_features_in_ == 3


def test_fit_validates_shapes_and_targets() -> None:
    x, y = synthetic_xy()
    model = regressors.LayerLatencyModel(**FAST)
    with pytest.raises(errors.InvalidRequestError, match="X"):
        model.fit(x, y[:-1])
    y_bad = y.copy()
    y_bad[3] = np.nan
    with pytest.raises(errors.InvalidRequestError, match="finite"):
        model.fit(x, y_bad)
    with pytest.raises(errors.BundleError, match="not fitted"):
        model.predict(x)


def test_learns_held_out_rows_and_orders_quantiles() -> None:
    x, y = synthetic_xy(800)
    model = regressors.LayerLatencyModel(**{**FAST, "n_estimators": 80}).fit(x[:600], y[:600])
    q = model.predict_quantiles(x[600:])
    assert np.sqrt(np.mean((q["median"] - y[600:]) ** 2)) < 0.1
    assert (q["p10"] <= q["median"]).all() and (q["median"] <= q["p90"]).all()
    with pytest.raises(errors.InvalidRequestError, match="expected 3 features"):
        model.predict(x[:, :2])


def test_same_random_state_same_model() -> None:
    x, y = synthetic_xy()
    a = regressors.LayerLatencyModel(**FAST, random_state=7).fit(x, y).predict(x)
    b = regressors.LayerLatencyModel(**FAST, random_state=7).fit(x, y).predict(x)
    np.testing.assert_array_equal(a, b)


def test_predictor_names_model_fallback_and_none(gemm_bundle: bundles.Bundle) -> None:
    t4 = devices.load_catalog().resolve("t4")
    none = WorkItem(layer="r", family=OpFamily.SHAPE_ONLY, kernel="none", phase=Phase.FORWARD,
                    dims={}, dtype="int64", flops=0, bytes_moved=0)
    items = [gemm_item(64), gemm_item(128, kernel="softmax"), none, gemm_item(512)]
    pred = learned.LearnedPredictor(gemm_bundle).predict(items, t4)
    assert pred.predictor == ("lightgbm:gemm", "roofline", "none", "lightgbm:gemm")
    assert pred.median_ms[2] == 0.0
    roof = RooflinePredictor().predict([items[1]], t4)
    assert pred.median_ms[1] == roof.median_ms[0]
    assert (pred.median_ms[[0, 3]] > 0).all()
    assert (pred.p10_ms <= pred.median_ms).all() and (pred.median_ms <= pred.p90_ms).all()


def test_unseen_devices_get_the_transfer_model(gemm_bundle: bundles.Bundle) -> None:
    from gpuplan_estimator.cost import features

    catalog = devices.load_catalog()
    t4, a100 = catalog.resolve("t4"), catalog.resolve("a100-pcie-40gb")
    cols = features.transfer_columns("gemm")
    items = [gemm_item(m) for m in range(8, 1024, 8)]
    wc = features.columns_from_items("gemm", items)
    x, _ = features.feature_matrix(wc, features.broadcast_device(t4, wc.dtype, 0))
    transfer = regressors.LayerLatencyModel(**FAST).fit(x[:, cols], np.full(len(items), 0.5))
    seen_t4 = bundles.Bundle(models=gemm_bundle.models,
                            manifest={**gemm_bundle.manifest, "devices": ["t4"]},
                            transfer_models={"gemm": transfer})
    predictor = learned.LearnedPredictor(seen_t4)
    assert predictor.predict(items[:2], t4).predictor == ("lightgbm:gemm",) * 2
    on_a100 = predictor.predict(items[:2], a100)
    assert on_a100.predictor == ("lightgbm:gemm:transfer",) * 2
    base = features.base_ms(features.columns_from_items("gemm", items[:2]),
                            features.broadcast_device(a100, wc.dtype[:2], 0))
    np.testing.assert_allclose(on_a100.median_ms, base * np.exp(0.5), rtol=1e-6)


def test_model_never_trained_on_the_platform_is_not_used(gemm_bundle: bundles.Bundle) -> None:
    cpu_only = bundles.Bundle(models=gemm_bundle.models, manifest={
        **gemm_bundle.manifest, "kernel_platforms": {"gemm": ["cpu"]}})
    t4 = devices.load_catalog().resolve("t4")
    assert learned.LearnedPredictor(cpu_only).predict([gemm_item(64)], t4).predictor == (
        "roofline",)


def test_unknown_backend_falls_back_to_roofline(gemm_bundle: bundles.Bundle) -> None:
    t4 = devices.load_catalog().resolve("t4")
    pred = learned.LearnedPredictor(gemm_bundle, backend="tensorrt").predict([gemm_item(64)], t4)
    assert pred.predictor == ("roofline",)


def test_one_model_call_per_kernel_per_device(gemm_bundle: bundles.Bundle,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    model = gemm_bundle.models["gemm"]
    real = model.predict_quantiles

    def counting(x: np.ndarray) -> dict[str, np.ndarray]:
        calls.append(len(x))
        return real(x)

    monkeypatch.setattr(model, "predict_quantiles", counting)
    catalog = devices.load_catalog()
    keys = catalog.keys()
    gpus = [catalog.resolve(k) for k in keys if catalog.resolve(k).vendor == "nvidia"]
    items = [gemm_item(8 + i % 4000) for i in range(10_000)]
    for gpu in gpus[:20]:
        learned.LearnedPredictor(gemm_bundle).predict(items, gpu)
    assert calls == [4_000] * min(20, len(gpus))  # one call per device, distinct shapes only


def test_duplicates_and_reused_requests_price_like_fresh_ones(gemm_bundle: bundles.Bundle) -> None:
    catalog = devices.load_catalog()
    t4, v100 = catalog.resolve("t4"), catalog.resolve("v100-pcie-32gb")
    items = [gemm_item(m) for m in (64, 128, 64, 256, 128)]
    predictor = learned.LearnedPredictor(gemm_bundle)
    first = predictor.predict(items, t4)
    np.testing.assert_array_equal(first.median_ms[[0, 1]], first.median_ms[[2, 4]])
    single = learned.LearnedPredictor(gemm_bundle).predict([items[3]], t4)
    assert first.median_ms[3] == single.median_ms[0]
    other = [gemm_item(m) for m in (512, 1024, 512, 8, 16)]  # same length, new items
    np.testing.assert_array_equal(
        predictor.predict(other, v100).median_ms,
        learned.LearnedPredictor(gemm_bundle).predict(other, v100).median_ms)


def test_sample_weight_is_validated_and_changes_the_fit() -> None:
    x, y = synthetic_xy()
    with pytest.raises(errors.InvalidRequestError, match="sample_weight"):
        regressors.LayerLatencyModel(**FAST).fit(x, y, np.zeros(len(y)))
    heavy = np.where(x[:, 0] > 0, 50.0, 1.0)
    a = regressors.LayerLatencyModel(**FAST).fit(x, y).predict(x)
    b = regressors.LayerLatencyModel(**FAST).fit(x, y, heavy).predict(x)
    assert not np.array_equal(a, b)


def test_layout_credit_comes_off_cpu_convs_only() -> None:
    shipped = bundles.load_default()
    dims = {"batch": 8, "c_in": 256, "c_out": 64, "h": 56, "w": 56, "kernel_h": 1, "kernel_w": 1,
            "stride_h": 1, "stride_w": 1, "pad_h": 0, "pad_w": 0, "dilation_h": 1,
            "dilation_w": 1, "groups": 1}
    plain = WorkItem(layer="c", family=OpFamily.CONV, kernel="conv2d", phase=Phase.FORWARD,
                     dims=MappingProxyType(dims), dtype="float32", flops=1, bytes_moved=1,
                     op="Conv")
    credited = dataclasses.replace(plain, attributes=MappingProxyType(
        {layout_credits.LAYOUT_CREDIT: 8 * (256 + 64) * 56 * 56}))
    predictor = learned.LearnedPredictor(shipped)
    cpu = local_cpu.local_cpu_device()
    base, less = predictor.predict([plain, credited], cpu).median_ms
    assert 0.5 * base <= less < base
    gpu = devices.load_catalog().resolve("a100-pcie-40gb")
    assert len(set(predictor.predict([plain, credited], gpu).median_ms)) == 1
