"""Import of gpu-ops files: column mapping onto canonical dims, errors, idempotent storage."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pandas as pd
import pytest

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.measurements import MEASUREMENT_COLUMNS, dims_from_json
from gpuplan_estimator.perfdb import importing
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.paths import REPO_ROOT, SHARED_DATA

SHARED = SHARED_DATA / "gpu-ops"


def gemm_rows(op: str) -> pd.DataFrame:
    return pd.DataFrame({
        "op": op, "device": ["Tesla T4", "NVIDIA A100-PCIE-40GB"],
        "B": [2, 1], "M": [3, 5], "N": [7, 11], "K": [13, 17],
        "latency_ms": [0.1, 0.2], "kernel_name": "sgemm", "n_kernels": 1,
    })


@pytest.fixture
def store(tmp_path: Path) -> Iterator[PerfStore]:
    with PerfStore.open(f"sqlite:///{tmp_path / 'perf.db'}") as s:
        yield s


def test_bmm_maps_n_to_the_contraction(tmp_path: Path) -> None:
    path = tmp_path / "bmm.parquet"
    gemm_rows("bmm").to_parquet(path)
    frame = importing.load_gpu_ops_frame(path)
    assert list(frame.columns) == list(MEASUREMENT_COLUMNS)
    assert frame["device"].tolist() == ["t4", "a100-pcie-40gb"]
    assert dims_from_json(frame["dims"][0]) == {"batch": 2, "m": 3, "k": 7, "n": 13, "bias": 0}
    assert frame["dims"][0] == '{"batch":2,"bias":0,"k":7,"m":3,"n":13}'  # sorted, compact
    row = frame.iloc[0]
    assert (row["kernel"], row["op"], row["dtype"], row["backend"]) == (
        "gemm", "matmul", "float32", "pytorch-2.1.0+cu121")
    assert row["repeats"] == 5
    assert "5 fastest of 25" in row["source"] and "bmm.parquet" in row["source"]


def test_linear_has_bias_and_csv_works(tmp_path: Path) -> None:
    path = tmp_path / "linear.csv"
    gemm_rows("linear").to_csv(path, index=False)
    frame = importing.load_gpu_ops_frame(path)
    assert dims_from_json(frame["dims"][1]) == {"batch": 1, "m": 5, "k": 11, "n": 17, "bias": 1}


def test_conv_norm_softmax_elementwise_mapping(tmp_path: Path) -> None:
    conv = pd.DataFrame({"op": "conv", "device": "Tesla P4", "B": [4], "Input_Channel": [3],
                         "Output_Channel": [8], "kernel_size": [3], "Input_Size": [32],
                         "Stride": [1], "Padding": [1], "latency_ms": [0.3]})
    rows = pd.DataFrame({"op": ["ln", "softmax", "add", "addu", "gelu", "powu"],
                         "device": "Tesla V100-PCIE-32GB", "B": [10, 11, 12, 13, 14, 15],
                         "H": [20, 21, 22, 23, 24, 25], "latency_ms": 0.05})
    conv.to_parquet(tmp_path / "conv.parquet")
    rows.to_parquet(tmp_path / "mixed.parquet")
    c = importing.load_gpu_ops_frame(tmp_path / "conv.parquet")
    assert c["kernel"][0] == "conv2d" and c["device"][0] == "p4"
    assert dims_from_json(c["dims"][0]) == {
        "batch": 4, "c_in": 3, "c_out": 8, "h": 32, "w": 32, "kernel_h": 3, "kernel_w": 3,
        "stride_h": 1, "stride_w": 1, "pad_h": 1, "pad_w": 1, "dilation_h": 1, "dilation_w": 1,
        "groups": 1}
    m = importing.load_gpu_ops_frame(tmp_path / "mixed.parquet")
    assert m["kernel"].tolist() == ["layernorm", "softmax"] + ["elementwise"] * 4
    assert m["op"].tolist() == ["layernorm", "softmax", "add", "addu", "gelu", "powu"]
    assert [dims_from_json(d) for d in m["dims"]][:3] == [
        {"rows": 10, "cols": 20}, {"rows": 11, "cols": 21},
        {"rows": 12, "cols": 22, "operands": 2}]
    assert [dims_from_json(d)["operands"] for d in m["dims"][2:]] == [2, 1, 1, 1]


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda f: f.drop(columns="N"), r"missing column\(s\) N"),
        (lambda f: f.drop(columns="device"), r"missing column\(s\) device"),
        (lambda f: f.assign(op="fft"), "column op has unknown value"),
        (lambda f: f.assign(latency_ms=[0.1, -2.0]), "column latency_ms must be positive"),
        (lambda f: f.assign(M=[3.5, 2.0]), "column M must hold non-negative integers"),
        (lambda f: f.assign(device="Voodoo 2"), "column device: unknown device 'Voodoo 2'"),
    ],
)
def test_malformed_files_name_file_and_column(
    tmp_path: Path, mutate: Callable[[pd.DataFrame], pd.DataFrame], match: str
) -> None:
    path = tmp_path / "bad.parquet"
    mutate(gemm_rows("bmm")).to_parquet(path)
    with pytest.raises(errors.GpuplanError, match=match) as info:
        importing.load_gpu_ops_frame(path)
    assert str(path) in str(info.value)


def test_foreign_and_unreadable_files(tmp_path: Path, store: PerfStore) -> None:
    foreign = tmp_path / "sales.csv"
    pd.DataFrame({"region": ["x"], "revenue": [1]}).to_csv(foreign, index=False)
    with pytest.raises(errors.GpuplanError, match=r"sales.csv: missing column\(s\) op, device"):
        importing.load_gpu_ops_frame(foreign)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"not parquet")
    with pytest.raises(errors.GpuplanError, match=r"junk\.parquet: not a readable parquet"):
        importing.load_gpu_ops_frame(junk)
    with pytest.raises(errors.GpuplanError, match="unsupported file type"):
        importing.load_gpu_ops_frame(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(errors.GpuplanError, match=r"no \.parquet or \.csv files"):
        importing.import_gpu_ops(tmp_path / "empty", store)
    with pytest.raises(errors.GpuplanError, match="no such file"):
        importing.import_gpu_ops(tmp_path / "missing.parquet", store)


def test_import_is_idempotent_with_one_run_per_file_and_device(
    tmp_path: Path, store: PerfStore
) -> None:
    data = tmp_path / "ops"
    data.mkdir()
    gemm_rows("bmm").to_parquet(data / "bmm.parquet")
    twice = pd.concat([gemm_rows("linear")] * 2, ignore_index=True)  # repeated shapes are kept
    twice.to_csv(data / "linear.csv", index=False)
    first = importing.import_gpu_ops(data, store)
    assert (first.rows_read, first.rows_added, len(first.runs)) == (6, 6, 4)
    second = importing.import_gpu_ops(data, store)
    assert (second.rows_read, second.rows_added) == (6, 0)
    assert "0 added" in second.summary()
    runs = store.runs()
    assert len(runs) == 4 and {r.status for r in runs} == {"done"}
    assert all(r.source.startswith("import ") and "sha256:" in r.source for r in runs)
    got = store.measurements(devices=["t4"])
    assert len(got) == 3 and set(got["backend"]) == {"pytorch-2.1.0+cu121"}


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared gpu-ops data not at {SHARED}")
def test_real_layernorm_file_maps_every_row() -> None:
    frame = importing.load_gpu_ops_frame(SHARED / "layernorm.parquet")
    assert len(frame) == 7000
    assert set(frame["device"]) == {"p4", "t4", "p100-pcie-16gb", "v100-pcie-32gb",
                                    "a100-pcie-40gb"}
    raw = pd.read_parquet(SHARED / "layernorm.parquet")
    assert dims_from_json(frame["dims"][0]) == {"rows": int(raw["B"][0]), "cols": int(raw["H"][0])}


@pytest.mark.slow
@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared gpu-ops data not at {SHARED}")
def test_full_shared_import_is_complete_and_idempotent(store: PerfStore) -> None:
    report = importing.import_gpu_ops(SHARED, store)
    assert report.rows_read == report.rows_added == 256_509
    assert importing.import_gpu_ops(SHARED, store).rows_added == 0
    counts = store.measurements().groupby("kernel").size().to_dict()
    assert counts == {"gemm": 87_623 + 32_224, "conv2d": 24_662, "layernorm": 7_000,
                      "softmax": 8_750, "elementwise": 96_250}


def test_measurement_frame_files_import_as_is(tmp_path: Path, store: PerfStore) -> None:
    frame = pd.DataFrame({
        "device": ["cpu", "Tesla T4"], "backend": "onnxruntime-1.23.2-cpu",
        "kernel": "softmax", "op": "softmax", "dtype": "float32",
        "dims": ['{"cols":2,"rows":1}', '{"cols":4,"rows":3}'], "latency_ms": [0.01, 0.02],
        "latency_std_ms": [0.001, 0.002], "repeats": 5, "source": "gpuplan-bench run 1",
        "latency_min_ms": [0.009, 0.019],
    })
    frame.to_parquet(tmp_path / "cpu.parquet")
    first = importing.import_gpu_ops(tmp_path / "cpu.parquet", store)
    assert (first.rows_added, len(first.runs)) == (2, 2)
    assert importing.import_gpu_ops(tmp_path / "cpu.parquet", store).rows_added == 0
    got = store.measurements(devices=["t4"])
    assert got["latency_min_ms"].tolist() == [0.019]
    assert {r.backend for r in store.runs()} == {"onnxruntime-1.23.2-cpu"}
    frame.assign(dims=["{bad", "{}"]).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(errors.GpuplanError, match=r"bad\.csv: column dims row 0"):
        importing.import_gpu_ops(tmp_path / "bad.csv", store)


@pytest.mark.parametrize("path", sorted(
    (REPO_ROOT / "estimator/gpuplan_estimator/data/cpu-measurements").glob("*.parquet")),
    ids=lambda p: p.name)
def test_shipped_cpu_measurements_load_as_a_measurement_frame(path: Path) -> None:
    """Every shipped file loads whole: as many rows as its provenance sidecar records."""
    frame = importing.load_measurement_file(path)
    recorded = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
    assert len(frame) == recorded["rows"] > 0 and set(frame["device"]) == {"cpu"}


def test_shipped_cpu_measurements_cover_every_kernel() -> None:
    directory = REPO_ROOT / "estimator/gpuplan_estimator/data/cpu-measurements"
    kernels = set().union(*(set(importing.load_measurement_file(p)["kernel"])
                            for p in directory.glob("*.parquet")))
    assert {"gemm", "conv2d", "elementwise", "layernorm", "softmax", "pool", "memcpy"} <= kernels


@pytest.mark.skipif(not SHARED.is_dir(), reason=f"shared gpu-ops data not at {SHARED}")
def test_the_eager_call_dispatch_is_the_shared_datas_floor() -> None:
    """`host.EAGER_CALL_DISPATCH_MS` is read off these rows: the median over their GPUs of the
    fastest tiny elementwise call, less a tiny kernel's own time."""
    from gpuplan_estimator.step import host

    raw = pd.read_parquet(SHARED / "elementwise.parquet")
    tiny = raw[raw["B"] * raw["H"] <= 4096]
    floor_ms = tiny.groupby("device")["latency_ms"].min().median()
    assert floor_ms - host.MIN_KERNEL_MS == pytest.approx(host.EAGER_CALL_DISPATCH_MS, abs=5e-4)
