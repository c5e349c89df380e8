"""The CPU closed loop's first half: bench this host (real onnxruntime, SQLite), fit on its rows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.bench import timing
from gpuplan_estimator.core import errors, layers
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.evaluation import host_bench
from gpuplan_estimator.latency import learned

SOFTMAX_SWEEP = """
kernel: softmax
ops: [softmax]
dims: {rows: {log: [1, 256]}, cols: {log: [1, 256]}}
limits: {cpu: {max_flops: 1.0e7, max_bytes: 1.0e7}}
"""
FAST = timing.TimingSettings(warmup_runs=1, repeats=2, min_runs=2, max_runs=3)


def settings(tmp_path: Path, **kw: object) -> host_bench.HostBenchSettings:
    sweeps = tmp_path / "sweeps"
    sweeps.mkdir(exist_ok=True)
    (sweeps / "softmax.yaml").write_text(SOFTMAX_SWEEP)
    base: dict[str, object] = {"minutes": 5.0, "samples": 80, "seed": 3, "min_rows": 60,
                               "db_url": f"sqlite:///{tmp_path / 'perf.db'}",
                               "sweep_paths": (str(sweeps),), "timing": FAST}
    return host_bench.HostBenchSettings(**{**base, **kw})  # type: ignore[arg-type]


def test_bench_then_fit_prices_this_host(tmp_path: Path) -> None:
    models = host_bench.bench_and_fit(settings(tmp_path))
    assert models.status == "done" and models.rows == 80
    assert set(models.bundle.cpu_models) == {"softmax"} and not models.bundle.models
    assert models.bundle.manifest["devices"] == ["cpu"]
    item = WorkItem(layer="s", family=layers.OpFamily.SOFTMAX, kernel="softmax",
                    phase=Phase.FORWARD, dims={"rows": 64, "cols": 128}, dtype="float32",
                    flops=5 * 64 * 128, bytes_moved=8 * 64 * 128, op="Softmax")
    pred = learned.LearnedPredictor(models.bundle).predict([item], devices.resolve_device("cpu"))
    assert np.all(np.isfinite(pred.median_ms)) and float(pred.median_ms[0]) > 0
    assert "80 onnxruntime-" in models.describe()
    again = host_bench.bench_and_fit(settings(tmp_path))  # resumes: same run, nothing re-timed
    assert again.run_id == models.run_id and again.rows == 80


def test_too_few_rows_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidRequestError, match="--cpu-bench-minutes"):
        host_bench.bench_and_fit(settings(tmp_path, samples=20, min_rows=60))


def test_speed_ratio_retimes_stored_rows_and_skips_tiny_ones() -> None:
    import pandas as pd

    from gpuplan_estimator.bench import sweep

    dims = sweep.dims_json({"batch": 1, "m": 256, "k": 256, "n": 256, "bias": 0})
    frame = pd.DataFrame({"kernel": ["gemm", "softmax"], "op": ["matmul", "softmax"],
                          "dtype": ["float32"] * 2, "latency_ms": [10.0, 0.001],
                          "dims": [dims, sweep.dims_json({"rows": 1, "cols": 2})]})
    ratio, checked = host_bench.speed_ratio(frame, per_kernel=3, seed=0, settings=FAST)
    assert checked == 1  # the 1 us softmax row is too short to time well
    assert 0.0 < ratio < 1.0  # a 256^3 matmul takes far less than the stored 10 ms
    assert host_bench.speed_ratio(frame[frame["kernel"] == "softmax"], 3, 0, FAST) == (1.0, 0)


def test_scaled_predictor_multiplies_every_time() -> None:
    from gpuplan_estimator.cost import roofline

    item = WorkItem(layer="s", family=layers.OpFamily.SOFTMAX, kernel="softmax",
                    phase=Phase.FORWARD, dims={"rows": 64, "cols": 128}, dtype="float32",
                    flops=5 * 64 * 128, bytes_moved=8 * 64 * 128, op="Softmax")
    t4 = devices.load_catalog().resolve("t4")
    base = roofline.RooflinePredictor().predict([item], t4)
    scaled = host_bench.ScaledPredictor(roofline.RooflinePredictor(), 0.5).predict([item], t4)
    np.testing.assert_allclose(scaled.median_ms, base.median_ms * 0.5)
    np.testing.assert_allclose(scaled.p90_ms, base.p90_ms * 0.5)
    assert scaled.predictor == base.predictor


def test_torch_backend_bench_fits_torch_cpu_models(tmp_path: Path) -> None:
    models = host_bench.bench_and_fit(settings(tmp_path, backend="torch"))
    assert models.backend.startswith("torch-") and models.backend.endswith("-cpu")
    assert models.bundle.manifest["backends"] == [models.backend]
    assert f"80 {models.backend} CPU rows" in models.describe()
    ort_models = host_bench.bench_and_fit(settings(tmp_path))  # same DB, the other backend
    assert ort_models.rows == 80 and ort_models.run_id != models.run_id
