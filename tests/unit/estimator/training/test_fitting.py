"""Training orchestration on a small synthetic measurement frame with real catalog devices."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors, measurements, workload
from gpuplan_estimator.core.layers import OpFamily
from gpuplan_estimator.cost import features
from gpuplan_estimator.latency import basis, bundles, learned
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.training import fitting, report
from gpuplan_testing.paths import REPO_ROOT

DEVICES = ("t4", "v100-pcie-32gb", "a100-pcie-40gb")
FAST = {"n_estimators": 25, "num_leaves": 15, "min_child_samples": 5, "n_jobs": 1}


def synthetic_frame(rows_per_device: int = 120, seed: int = 0, keys: tuple[str, ...] = DEVICES,
                    slowdown: float = 1.0) -> pd.DataFrame:
    """gemm + softmax rows whose latency is a known efficiency times the feature base (times
    `slowdown`, a device constant no spec feature explains)."""
    rng = np.random.default_rng(seed)
    catalog = devices.load_catalog()
    out = []
    for key in keys:
        spec = catalog.resolve(key)
        for kernel in ("gemm", "softmax"):
            if kernel == "gemm":
                m, k, n = (rng.integers(8, 1024, rows_per_device) for _ in range(3))
                dims = {"batch": np.ones_like(m), "m": m, "k": k, "n": n, "bias": np.zeros_like(m)}
            else:
                dims = {"rows": rng.integers(1, 4096, rows_per_device),
                        "cols": rng.integers(8, 4096, rows_per_device)}
            dtype = np.full(rows_per_device, "float32")
            cols = features.WorkColumns(kernel, dims, dtype, np.full(rows_per_device, kernel))
            base = features.base_ms(cols, features.broadcast_device(spec, dtype, 0))
            eff = 1.3 + 0.4 * np.sin(np.log(dims["rows" if kernel == "softmax" else "m"]))
            latency = slowdown * base * eff * np.exp(rng.normal(0, 0.01, rows_per_device))
            out.append(pd.DataFrame({
                "device": key, "backend": "pytorch-2.1.0+cu121", "kernel": kernel,
                "op": kernel, "dtype": "float32",
                "dims": [measurements.dims_to_json({k: int(v[i]) for k, v in dims.items()})
                         for i in range(rows_per_device)],
                "latency_ms": latency, "latency_std_ms": np.nan, "repeats": 25, "source": "synth",
            }))
    return pd.concat(out, ignore_index=True)


def fixed_clock() -> datetime:
    return datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    return synthetic_frame()


@pytest.fixture(scope="module")
def fitted(frame: pd.DataFrame) -> fitting.Bundle:
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    return fitting.train_bundle(frame, settings, now=fixed_clock, command="test", commit="abc")


def test_bundle_has_a_model_per_kernel_and_provenance(fitted: fitting.Bundle, frame: pd.DataFrame
                                                      ) -> None:
    assert sorted(fitted.models) == sorted(fitted.transfer_models) == ["gemm", "softmax"]
    m = fitted.manifest
    assert m["created"] == "2025-01-02T03:04:05+00:00"
    assert m["devices"] == sorted(DEVICES)
    assert m["data_digest"] == fitting.data_digest(frame)
    assert m["default_backends"] == {"gpu": "pytorch-2.1.0+cu121"}
    assert m["kernel_platforms"] == {"gemm": ["gpu"], "softmax": ["gpu"]}
    assert m["device_platforms"] == dict.fromkeys(sorted(DEVICES), "gpu")


def test_held_out_metrics_learn_the_synthetic_efficiency(fitted: fitting.Bundle) -> None:
    for kernel in ("gemm", "softmax"):
        metrics = fitted.manifest["metrics"][kernel]
        assert metrics["random_split"]["rows"] == pytest.approx(0.2 * 360, abs=1)
        assert metrics["random_split"]["mape_pct"] < 8.0
        assert set(metrics["leave_one_device_out"]) == set(DEVICES)
        assert set(metrics["random_split_by_device"]) == set(DEVICES)
        assert set(metrics["random_split_by_platform"]) == {"gpu"}
        probed = metrics["leave_one_device_out_probe"]
        assert set(probed) == set(DEVICES)
        assert all(v["rows"] == 120 - 20 and v["probe_rows"] == 20 for v in probed.values())


def test_leave_one_gpu_out_gives_unseen_and_probed_gpus_a_shared_interval_sigma(
        fitted: fitting.Bundle, frame: pd.DataFrame) -> None:
    """The held-out GPUs' synthetic-model errors become the manifest's shared log-sigma per
    kernel: small where one efficiency explains every GPU, large where a device constant no
    spec explains makes the left-out GPU's prediction wrong as a whole."""
    table = fitted.manifest[intervals.MANIFEST_KEY]
    assert table[basis.EXTRAPOLATED] == table[basis.PROBED]
    even = intervals.manifest_sigmas(fitted.manifest, basis.EXTRAPOLATED)
    assert even is not None and set(even) == {"gemm", "softmax"}
    assert all(0 < s.all_sizes < 0.15 for s in even.values())
    assert all(fitting.SHARED_LOG_SIGMA not in m for m in fitted.manifest["metrics"].values())
    # A GPU the bundle timed shares less: its held-out shapes come from the models that fit it.
    measured = intervals.manifest_sigmas(fitted.manifest, basis.MEASURED)
    assert measured is not None and set(measured) == set(even)
    assert all(fitting.MEASURED_LOG_SIGMA not in m for m in fitted.manifest["metrics"].values())

    uneven = pd.concat([synthetic_frame(keys=(k,), seed=i, slowdown=s) for i, (k, s) in
                        enumerate(zip(DEVICES, (1.0, 1.6, 0.6), strict=True))],
                       ignore_index=True)
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    uneven_manifest = fitting.train_bundle(uneven, settings).manifest
    sigmas = intervals.manifest_sigmas(uneven_manifest, basis.EXTRAPOLATED)
    assert sigmas is not None
    # Left out, the slow V100 and the fast A100 are each off by ~log 1.6 as a whole; measured,
    # the device features place each of them.
    assert all(sigmas[k].all_sizes > 0.3 > 2 * even[k].all_sizes for k in even)
    timed = intervals.manifest_sigmas(uneven_manifest, basis.MEASURED)
    assert timed is not None and all(timed[k].all_sizes < 0.15 for k in even)
    assert "interval_log_sigma" not in fitting.train_bundle(
        uneven, settings, validate=False).manifest


def test_a_gpu_with_a_few_rows_is_probed_not_trained_on(frame: pd.DataFrame) -> None:
    """Its rows set an offset on the transfer model; the offset recovers a device constant
    that the spec features cannot, and the other devices' models never see its rows."""
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    new_gpu = synthetic_frame(30, seed=5, keys=("p100-pcie-16gb",), slowdown=2.0)
    new_gpu["backend"] = "onnxruntime-1.23.2-cuda"  # a short `gpuplan bench` on the new GPU
    probed = fitting.train_bundle(pd.concat([frame, new_gpu], ignore_index=True), settings,
                                validate=False)
    plain = fitting.train_bundle(frame, settings, validate=False)
    m = probed.manifest
    assert "p100-pcie-16gb" not in m["devices"] and m["probe_rows"] == 60
    assert m["data_digest"] == fitting.data_digest(pd.concat([frame, new_gpu]))
    # Probing an already fitted bundle (what the eval does per left-out GPU) agrees.
    assert fitting.with_probes(plain, new_gpu).manifest["probe_offsets"] == m["probe_offsets"]
    offset = m["probe_offsets"]["p100-pcie-16gb"]["gemm"]
    assert offset["rows"] == 30 and offset["log_offset"] == pytest.approx(np.log(2.0), abs=0.15)
    for kernel in ("gemm", "softmax"):  # probe rows moved no fitted model
        x = np.random.default_rng(3).normal(size=(20, len(features.feature_names(kernel))))
        np.testing.assert_array_equal(probed.models[kernel].predict(x),
                                      plain.models[kernel].predict(x))

    spec = devices.load_catalog().resolve("p100-pcie-16gb")
    items = [workload.WorkItem(layer="fc", family=OpFamily.MATMUL, kernel="gemm",
                               phase=workload.Phase.FORWARD, dtype="float32", flops=0,
                               bytes_moved=0, dims={"batch": 1, "m": m_, "k": 512, "n": 256,
                                                    "bias": 0}) for m_ in (64, 256, 900)]
    truth = 2.0 * features.base_ms(features.columns_from_items("gemm", items),
                                   features.broadcast_device(spec, np.full(3, "float32"), 0))
    truth *= 1.3 + 0.4 * np.sin(np.log([64, 256, 900]))
    with_probe = learned.LearnedPredictor(probed).predict(items, spec)
    # The spec-only transfer model: these synthetic latencies have no one-wave structure, so
    # the sub-wave pricing (`bundles.SUB_WAVE_KEY`) is left out of what the probe is compared to.
    spec_only = dataclasses.replace(plain, manifest={
        k: v for k, v in plain.manifest.items() if k != bundles.SUB_WAVE_KEY})
    without = learned.LearnedPredictor(spec_only).predict(items, spec)
    assert with_probe.predictor == ("lightgbm:gemm:transfer+probe",) * 3
    assert without.predictor == ("lightgbm:gemm:transfer",) * 3
    assert np.abs(with_probe.median_ms / truth - 1).max() < 0.2
    assert np.abs(without.median_ms / truth - 1).min() > 0.3
    assert (with_probe.p10_ms <= with_probe.median_ms).all()
    assert (with_probe.median_ms <= with_probe.p90_ms).all()


def test_probe_rows_need_enough_rows_on_the_other_gpus(frame: pd.DataFrame) -> None:
    settings = fitting.TrainSettings(min_rows_per_kernel=50, probe_max_rows=100)
    kinds = dict.fromkeys(DEVICES, "gpu") | {"p100-pcie-16gb": "gpu"}
    new_gpu = synthetic_frame(30, seed=5, keys=("p100-pcie-16gb",))
    fit, probe = fitting.split_probe_rows(pd.concat([frame, new_gpu]), kinds, settings)
    assert set(probe["device"]) == {"p100-pcie-16gb"} and len(probe) == 60
    assert len(fit) == len(frame)
    # Every GPU small: nothing to shift, so all rows are fitted as before.
    few = synthetic_frame(30, seed=6)
    fit, probe = fitting.split_probe_rows(few, dict.fromkeys(DEVICES, "gpu"), settings)
    assert probe.empty and len(fit) == len(few)


def test_data_digest_ignores_row_order_but_not_values(frame: pd.DataFrame) -> None:
    shuffled = frame.sample(frac=1.0, random_state=1)
    assert fitting.data_digest(shuffled) == fitting.data_digest(frame)
    changed = frame.copy()
    latency = changed["latency_ms"].to_numpy().copy()
    latency[0] *= 2
    changed["latency_ms"] = latency
    assert fitting.data_digest(changed) != fitting.data_digest(frame)


def test_subsample_caps_rows_per_kernel_deterministically(frame: pd.DataFrame) -> None:
    a = fitting.subsample(frame, 90, seed=3)
    b = fitting.subsample(frame, 90, seed=3)
    assert a["kernel"].value_counts().to_dict() == {"gemm": 90, "softmax": 90}
    pd.testing.assert_frame_equal(a, b)
    assert set(a["device"]) == set(DEVICES)


def test_small_kernels_are_skipped_and_listed(frame: pd.DataFrame) -> None:
    tiny = pd.concat([frame[frame["kernel"] == "gemm"], frame[frame["kernel"] == "softmax"][:10]])
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    out = fitting.train_bundle(tiny, settings, validate=False)
    assert list(out.models) == ["gemm"]
    assert out.manifest["skipped_kernels"] == {"softmax": 10}


def test_bad_frames_are_rejected(frame: pd.DataFrame) -> None:
    with pytest.raises(errors.InvalidRequestError, match="dims"):
        fitting.train_bundle(frame.drop(columns=["dims"]), fitting.TrainSettings())
    bad = frame.copy()
    bad.loc[0, "latency_ms"] = 0.0
    with pytest.raises(errors.InvalidRequestError, match="latency_ms"):
        fitting.train_bundle(bad, fitting.TrainSettings(min_rows_per_kernel=50), validate=False)


def test_error_metrics_are_exact_on_known_values() -> None:
    got = fitting.error_metrics(np.array([1.0, 2.0]), np.array([1.1, 2.0]))
    assert got["mape_pct"] == pytest.approx(5.0)
    assert got["rows"] == 2


def test_report_lists_every_kernel_and_device(fitted: fitting.Bundle) -> None:
    text = report.report_markdown(fitted.manifest, today="2025-01-02", command="cmd")
    assert "Date 2025-01-02" in text and "`abc`" in text and "`cmd`" in text
    for kernel in ("gemm", "softmax"):
        for device in DEVICES:
            assert f"| {kernel} | {device} |" in text
    summary = text.split("## Summary")[1].split("## Random")[0]
    assert "| gemm |" in summary and "| softmax |" in summary


def test_report_links_the_hand_written_method_page(fitted: fitting.Bundle) -> None:
    """The generated report computes tables and carries no log of experiments: its Method
    section is one link to the page that holds those figures, and the shipped report ends so."""
    text = report.report_markdown(fitted.manifest, today="2025-01-02", command="cmd")
    method = text.split("## Method")[1]
    assert f"]({report.METHOD_DOC})" in method and len(method.strip().splitlines()) == 1
    page = (REPO_ROOT / "docs" / report.METHOD_DOC).read_text(encoding="utf-8")
    assert page.startswith("# Latency models: method") and "\n## Method\n" in page
    shipped = (REPO_ROOT / "docs" / "latency-models.md").read_text(encoding="utf-8")
    assert shipped.endswith("\n" + report.METHOD_POINTER + "\n")


def test_report_lists_the_cpu_once_as_its_platform(fitted: fitting.Bundle) -> None:
    gemm = fitted.manifest["metrics"]["gemm"]
    cpu = gemm["random_split"]
    manifest = {**fitted.manifest, "metrics": {"gemm": {
        **gemm, "random_split_by_platform": {"cpu": cpu},
        "random_split_by_device": {**gemm["random_split_by_device"], "cpu": cpu}}}}
    text = report.report_markdown(manifest, today="2025-01-02", command="cmd")
    assert "| gemm | **cpu** |" in text and "| gemm | cpu |" not in text


@pytest.mark.slow  # full-size default models: several seconds on a shared 2-core machine
def test_cli_trains_from_a_measurement_parquet(frame: pd.DataFrame, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    import argparse

    from gpuplan_estimator.interfaces.cli import training

    new_gpu = synthetic_frame(30, seed=5, keys=("p100-pcie-16gb",), slowdown=2.0)
    rows = pd.concat([frame, new_gpu], ignore_index=True)
    rows[rows["kernel"] == "softmax"].to_parquet(tmp_path / "rows.parquet")
    parser = argparse.ArgumentParser()
    training.register(parser.add_subparsers())
    args = parser.parse_args(["train", "--data", str(tmp_path / "rows.parquet"), "--out",
                              str(tmp_path / "b"), "--max-rows", "300", "--no-validate"])
    assert args.func(args) == 0
    loaded = bundles.load_bundle(tmp_path / "b")
    assert list(loaded.models) == ["softmax"]
    assert loaded.manifest["command"].startswith("gpuplan train --data")
    assert loaded.manifest["training_seconds"] >= 0
    out = capsys.readouterr().out
    assert "wrote bundle" in out
    assert "probed p100-pcie-16gb: softmax (30 rows, x" in out
    assert set(loaded.manifest["probe_offsets"]) == {"p100-pcie-16gb"}
    bad = parser.parse_args(["train", "--data", str(tmp_path / "missing.parquet")])
    with pytest.raises(errors.InvalidRequestError, match=r"missing\.parquet"):
        bad.func(bad)


def test_leave_one_out_skips_a_device_alone_on_its_platform() -> None:
    rng = np.random.default_rng(0)
    n = 400
    device = np.array(["g1", "g2", "g3", "c1"])[rng.integers(0, 4, n)]
    x = rng.normal(size=(n, len(features.transfer_columns("softmax"))))
    full = np.zeros((n, len(features.feature_names("softmax"))))
    full[:, features.transfer_columns("softmax")] = x
    y = 0.3 * x[:, 0]
    data = fitting.KernelData(full, y, np.ones(n), x, np.ones(n), np.exp(y), device,
                            np.where(device == "c1", "cpu", "gpu"),
                            np.where(device == "c1", "ort-cpu", "torch-cuda"))
    out = fitting.validate_kernel("softmax", data, fitting.TrainSettings(model_params=FAST))
    assert set(out["leave_one_device_out"]) == {"g1", "g2", "g3"}
    assert set(out["random_split_by_platform"]) == {"cpu", "gpu"}
    assert set(out["random_split_by_backend"]) == {"ort-cpu", "torch-cuda"}


def test_cpu_rows_get_their_own_models_and_leave_gpu_predictions_alone(
        frame: pd.DataFrame, tmp_path: Path) -> None:
    from gpuplan_estimator.core.layers import OpFamily
    from gpuplan_estimator.core.workload import Phase, WorkItem
    from gpuplan_estimator.latency import bundles

    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50,
                                   leave_one_device_out=False)
    gpu_only = fitting.train_bundle(frame, settings, validate=False)
    t4_rows = frame[frame["device"] == "t4"]
    cpu_rows = t4_rows.assign(device="cpu", backend="onnxruntime-1.23.2-cpu",
                              latency_ms=t4_rows["latency_ms"] * 40)
    both = fitting.train_bundle(pd.concat([frame, cpu_rows], ignore_index=True), settings)
    assert set(both.models) == set(both.cpu_models) == {"gemm", "softmax"}
    assert both.manifest["kernel_platforms"]["gemm"] == ["cpu", "gpu"]
    assert set(both.manifest["metrics"]["gemm"]["random_split_by_platform"]) == {"cpu", "gpu"}
    items = [WorkItem(layer=f"l{m}", family=OpFamily.MATMUL, kernel="gemm", phase=Phase.FORWARD,
                      dims={"batch": 1, "m": m, "k": 256, "n": 512, "bias": 0}, dtype="float32",
                      flops=0, bytes_moved=0, op="gemm") for m in (16, 128, 900)]
    t4 = devices.load_catalog().resolve("t4")
    np.testing.assert_allclose(learned.LearnedPredictor(both).predict(items, t4).median_ms,
                               learned.LearnedPredictor(gpu_only).predict(items, t4).median_ms)
    on_cpu = learned.LearnedPredictor(both).predict(items, devices.resolve_device("cpu"))
    assert on_cpu.predictor == ("lightgbm:gemm",) * 3
    loaded = bundles.load_bundle(bundles.save_bundle(both, tmp_path / "b"))
    np.testing.assert_array_equal(
        learned.LearnedPredictor(loaded).predict(items, devices.resolve_device("cpu")).median_ms,
        on_cpu.median_ms)


def test_probe_correction_recovers_offset_and_bounded_slope() -> None:
    base = np.logspace(-2, 1, 20)
    predicted = 3.0 * base
    fit = fitting.probe_correction(predicted * 1.5 * base**0.1, predicted, base)
    assert fit.log_offset == pytest.approx(np.log(1.5)) and fit.log_base_slope == pytest.approx(0.1)
    np.testing.assert_allclose(predicted * fit.factor(base), predicted * 1.5 * base**0.1)
    steep = fitting.probe_correction(predicted * base**0.9, predicted, base)
    assert steep.log_base_slope == fitting.MAX_PROBE_SLOPE
    one = fitting.probe_correction(np.array([2.0]), np.array([1.0]), np.array([0.5]))
    assert (one.log_offset, one.log_base_slope) == (pytest.approx(np.log(2.0)), 0.0)


def test_probe_correction_is_flat_beyond_the_probed_sizes() -> None:
    base = np.logspace(-2, 0, 20)  # probe kernels of 0.01 to 1 ms
    predicted = 3.0 * base
    fit = fitting.probe_correction(predicted * 1.5 * base**0.1, predicted, base)
    assert fit.log_base_slope == pytest.approx(0.1)
    inside = fit.factor(np.array([0.01, 1.0]))
    np.testing.assert_allclose(inside, 1.5 * np.array([0.01, 1.0]) ** 0.1)
    # A 100 ms GEMM gets the largest probe kernel's correction, not the line extended 100x.
    np.testing.assert_allclose(fit.factor(np.array([1e-4, 100.0])), inside)


def test_a_probe_spreads_over_kernel_sizes_and_keeps_a_small_kernel_whole(
        frame: pd.DataFrame) -> None:
    rows = frame[frame["device"] == "t4"]
    softmax = rows[rows["kernel"] == "softmax"].head(7)
    some = pd.concat([rows[rows["kernel"] == "gemm"], softmax])
    probe = fitting.probe_rows(some, 20, seed=0)
    assert probe["kernel"].value_counts().to_dict() == {"gemm": 20, "softmax": 7}
    pd.testing.assert_frame_equal(probe, fitting.probe_rows(some, 20, seed=0))
    gemm = some[some["kernel"] == "gemm"]
    base = fitting.kernel_data(gemm, "gemm", devices.resolve_device,
                               ["pytorch-2.1.0+cu121"]).base_ms
    picked = gemm.index.get_indexer(probe[probe["kernel"] == "gemm"].index)
    # One row per twentieth of the sizes: the largest 5 % and the smallest 5 % are both in.
    assert base[picked].max() >= np.quantile(base, 0.95)
    assert base[picked].min() <= np.quantile(base, 0.05)


def _gemm_items(ms: tuple[int, ...]) -> list[workload.WorkItem]:
    from gpuplan_estimator.core.layers import OpFamily

    return [workload.WorkItem(layer=f"fc{m_}", family=OpFamily.MATMUL, kernel="gemm",
                              phase=workload.Phase.FORWARD, dtype="float32", flops=0,
                              bytes_moved=0, dims={"batch": 1, "m": m_, "k": 1024, "n": 1024,
                                                   "bias": 0}) for m_ in ms]


@pytest.mark.parametrize("kind", ["tiled", "tiled-gemm", "roofline"])
def test_transfer_kind_round_trips_and_prices_an_unseen_gpu(
        frame: pd.DataFrame, tmp_path: Path, kind: str) -> None:
    """The bundle records its transfer structure; a saved and reloaded bundle prices a GPU
    it never saw exactly as before, with the transfer model of that structure."""
    bundle = fitting.train_bundle(
        frame, fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50,
                                     transfer_kind=kind), validate=False)
    assert bundle.manifest["transfer_kind"] == kind
    loaded = bundles.load_bundle(bundles.save_bundle(bundle, tmp_path / kind))
    assert len(loaded.transfer_models["gemm"].boosters_["median"].feature_name()) == len(
        features.transfer_feature_names("gemm", kind))
    h100 = devices.load_catalog().resolve("h100-sxm-80gb")
    items = _gemm_items((64, 1000, 4096, 16384))
    before = learned.LearnedPredictor(bundle).predict(items, h100)
    after = learned.LearnedPredictor(loaded).predict(items, h100)
    np.testing.assert_allclose(after.median_ms, before.median_ms, rtol=1e-9)
    # GEMMs of one wave or less are priced as that wave (`bundles.SUB_WAVE_KEY`), the rest by
    # the transfer model.
    one_wave = np.array(after.predictor) == learned.ONE_WAVE_LABEL
    assert set(np.array(after.predictor)[~one_wave]) == {"lightgbm:gemm:transfer"}
    assert (after.p10_ms <= after.median_ms).all() and (after.median_ms <= after.p90_ms).all()
    cols = features.columns_from_items("gemm", items)
    dev = features.broadcast_device(h100, cols.dtype, 0)
    x, base = features.feature_matrix(cols, dev)
    _, structure_ms = features.transfer_matrix(cols, dev, x, base, "tiled")
    # Utilisation of the tile-and-wave structure is at most 1: the one-wave price's median,
    # and a tiled transfer model's whole interval.
    assert (after.median_ms[one_wave] >= structure_ms[one_wave] * (1 - 1e-9)).all()
    if kind != "roofline":
        assert (after.p10_ms[~one_wave] >= structure_ms[~one_wave] * (1 - 1e-9)).all()


def test_unknown_transfer_kind_is_refused() -> None:
    with pytest.raises(errors.InvalidRequestError, match="unknown transfer kind"):
        fitting.TrainSettings(transfer_kind="neural")


def test_a_gpu_whose_rows_no_model_learned_from_is_probed_not_measured(
        frame: pd.DataFrame) -> None:
    """The H200 bench import (#30 part 6): its few gemm/softmax rows are probe rows and its
    memcpy rows are of a kernel too small to fit, so no model learned it; it must be labelled
    probed (and priced by the probed transfer model), not measured."""
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    new_gpu = synthetic_frame(30, seed=5, keys=("p100-pcie-16gb",), slowdown=2.0)
    copies = new_gpu.iloc[:10].assign(
        kernel="memcpy", op="memcpy", dims=measurements.dims_to_json({"elements": 4096}))
    bundle = fitting.train_bundle(pd.concat([frame, new_gpu, copies], ignore_index=True),
                                  settings, validate=False)
    p100 = devices.load_catalog().resolve("p100-pcie-16gb")
    assert "p100-pcie-16gb" not in bundle.manifest["devices"]
    assert sorted(bundle.manifest["devices"]) == sorted(DEVICES)
    predictor = learned.LearnedPredictor(bundle)
    assert basis.data_basis(predictor, p100) == basis.PROBED
    assert basis.data_basis(predictor, devices.load_catalog().resolve("t4")) == basis.MEASURED


def _with_dims(rows: pd.DataFrame, extra: dict[str, int]) -> pd.DataFrame:
    dims = [measurements.dims_to_json({**measurements.dims_from_json(d), **extra})
            for d in rows["dims"]]
    return rows.assign(dims=dims)


def test_a_tf32_row_is_normalised_by_the_tf32_peak(frame: pd.DataFrame) -> None:
    gemm = frame[(frame["device"] == "a100-pcie-40gb") & (frame["kernel"] == "gemm")].head(20)
    rows = pd.concat([gemm, _with_dims(gemm, {"math_tf32": 1})], ignore_index=True)
    data = fitting.kernel_data(rows, "gemm", devices.resolve_device, ["pytorch-2.1.0+cu121"])
    fp32_ms, tf32_ms = data.base_ms[:20], data.base_ms[20:]
    # The A100's tf32 tensor cores run 8x its fp32 SIMT rate: compute-bound shapes get faster.
    assert (tf32_ms <= fp32_ms).all() and (tf32_ms < fp32_ms).any()
    plain = fitting.kernel_data(gemm, "gemm", devices.resolve_device, ["pytorch-2.1.0+cu121"])
    np.testing.assert_array_equal(plain.base_ms, fp32_ms)


def test_gpu_rows_that_timed_no_kernel_are_dropped_and_counted(frame: pd.DataFrame) -> None:
    kinds = {d: devices.resolve_device(d).platform for d in frame["device"].unique()}
    fast = frame.head(3).assign(latency_ms=fitting.MIN_GPU_KERNEL_MS / 100)
    kept, dropped = fitting.drop_kernelless_rows(pd.concat([fast, frame]), kinds)
    assert dropped == 3 and len(kept) == len(frame)
    assert fitting.drop_kernelless_rows(frame, kinds)[1] == 0
    with pytest.raises(errors.InvalidRequestError, match="latency_ms"):
        fitting.drop_kernelless_rows(fast, kinds)
    # A CPU row may be that fast (onnxruntime's no-op Identity): kept.
    assert fitting.drop_kernelless_rows(fast, dict.fromkeys(kinds, "cpu"))[1] == 0


def test_a_device_with_few_rows_keeps_them_all_when_others_are_thinned(frame: pd.DataFrame
                                                                       ) -> None:
    """A benchmark Job's rows of one new GPU beside many shared rows: all of them are fitted."""
    gemm = frame[frame["kernel"] == "gemm"]
    few_device = DEVICES[0]
    few = gemm[gemm["device"] == few_device].head(5)
    rows = pd.concat([few, gemm[gemm["device"] != few_device]], ignore_index=True)
    kept = fitting.subsample(rows, 60, seed=3)
    counts = kept["device"].value_counts().to_dict()
    assert counts[few_device] == 5
    assert sum(counts.values()) == 60
    assert max(counts.values()) - min(v for d, v in counts.items() if d != few_device) <= 1


def test_device_quotas_fill_evenly_from_the_smallest() -> None:
    assert fitting.device_quotas({"a": 3, "b": 100, "c": 100}, 51) == {"a": 3, "b": 24, "c": 24}
    assert fitting.device_quotas({"a": 10, "b": 10}, 100) == {"a": 10, "b": 10}


def test_a_gpu_timed_by_a_backend_no_other_gpu_shares_is_not_left_out(frame: pd.DataFrame
                                                                       ) -> None:
    """Its held-out error would measure its backend's timing, not the transfer model."""
    lone = frame.assign(backend=np.where(frame["device"] == DEVICES[0], "torch-bench-cuda",
                                         frame["backend"]))
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    data = fitting.kernel_data(lone, "gemm", devices.resolve_device,
                               sorted(lone["backend"].unique()))
    assert set(fitting.leave_one_device_out("gemm", data, settings)) == set(DEVICES[1:])


def test_a_kernel_timed_on_one_gpu_has_no_transfer_model(frame: pd.DataFrame) -> None:
    one = pd.concat([frame[frame["kernel"] == "gemm"],
                     frame[(frame["kernel"] == "softmax") & (frame["device"] == DEVICES[0])]],
                    ignore_index=True)
    settings = fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50)
    out = fitting.train_bundle(one, settings, validate=False)
    assert set(out.models) == {"gemm", "softmax"}
    assert set(out.transfer_models) == {"gemm"}
    # Its full model prices the GPU it timed; another one gets the roofline.
    assert out.manifest[bundles.KERNEL_DEVICES_KEY]["softmax"] == [DEVICES[0]]
    other = devices.resolve_device(DEVICES[1])
    assert not out.has_timed("softmax", other) and out.has_timed("gemm", other)
    item = workload.WorkItem(layer="s", family=OpFamily.SOFTMAX, kernel="softmax",
                             phase=workload.Phase.FORWARD,
                             dims={"rows": 64, "cols": 512}, dtype="float32", flops=1,
                             bytes_moved=1)
    assert learned.LearnedPredictor(out).predict([item], other).predictor == ("roofline",)


def test_windowed_elementwise_gpu_rows_stay_out_of_training() -> None:
    rows = pd.DataFrame({"device": ["t4", "t4", "cpu-x"], "kernel": ["elementwise"] * 3,
                         "op": ["lrn", "relu", "lrn"]})
    kept = fitting.drop_windowed_gpu_rows(rows, {"t4": "gpu", "cpu-x": "cpu"})
    assert kept["op"].tolist() == ["relu", "lrn"]
