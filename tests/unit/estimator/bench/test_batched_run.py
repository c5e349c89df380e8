"""Issue #30 part 7: a batched, multi-precision bench run, its export, and its import."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from gpuplan_estimator.bench import batched, precisions, runner, stopping
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.measurements import MEASUREMENT_COLUMNS
from gpuplan_estimator.interfaces.cli import bench as bench_cli
from gpuplan_estimator.perfdb import importing
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.bench_fixtures import TARGET, settings

BATCH = batched.BatchSettings(batch_size=4, repeats=2, target_launch_ms=0.2, max_reps=4)
ALL = ("fp32", "tf32", "bf16")


def batched_settings(sweep_dir: Path, **kw: object) -> runner.BenchSettings:
    return settings(sweep_dir, backend="torch", precisions=ALL, batch=BATCH, **kw)


def test_every_planned_row_is_measured_in_every_precision(sweep_dir: Path,
                                                          store: PerfStore) -> None:
    report = runner.run_bench(batched_settings(sweep_dir, samples=6), store, target=TARGET)
    # 6 sampled items, 3 gemm and 3 softmax: gemm x3 precisions, softmax x2 (no tf32 math).
    assert (report.status, report.planned, report.rows_added) == ("done", 15, 15)
    frame = store.measurements(run_id=report.run_id)
    tf32 = frame["dims"].str.contains(f'"{precisions.TF32_DIM}":1')
    assert set(frame.loc[tf32, "kernel"]) == {"gemm"} and set(frame.loc[tf32, "dtype"]) == {
        "float32"}
    assert set(frame["dtype"]) == {"float32", "bfloat16"}
    assert (frame["latency_ms"] > 0).all() and frame["fwd_bwd_latency_ms"].notna().any()
    families = {f.family: f for f in report.families}
    assert set(families) == {"gemm/fp32", "gemm/tf32", "gemm/bf16", "softmax/fp32",
                             "softmax/bf16"}
    assert all(f.ended == "exhausted" and f.rows == 3 for f in families.values())
    (run,) = store.runs()
    recorded = json.loads(run.settings_json)
    assert recorded["precisions"] == list(ALL) and recorded["batch"]["batch_size"] == 4
    assert recorded["versions"]["torch"]


def test_the_stop_rule_ends_families_and_the_run_counts_as_done(sweep_dir: Path,
                                                                store: PerfStore) -> None:
    rule = stopping.StopRule(holdout_every=2, patience=1, min_gain_pct=99.0, min_rows=4)
    report = runner.run_bench(batched_settings(sweep_dir, samples=40, stop_rule=rule), store,
                              target=TARGET)
    # With a 99 % gain asked, no batch improves enough: every family stops after its second
    # scored batch, long before its queue is empty.
    assert report.status == "done" and report.rows_total < report.planned
    assert {f.ended for f in report.families} == {"converged"}


def test_the_export_imports_with_the_real_importer(sweep_dir: Path, store: PerfStore,
                                                   tmp_path: Path) -> None:
    report = runner.run_bench(batched_settings(sweep_dir, samples=4), store, target=TARGET)
    path = tmp_path / "out" / "bench.parquet"
    assert runner.export_run(store, report.run_id, path, {"commit": "abc"}) == report.rows_total
    exported = pd.read_parquet(path)
    assert set(MEASUREMENT_COLUMNS) <= set(exported.columns)
    with PerfStore.open(f"sqlite:///{tmp_path / 'imported.db'}") as fresh:
        imported = importing.import_gpu_ops(path, fresh)
        assert imported.rows_added == report.rows_total
        rows = fresh.measurements()
    key = ["kernel", "op", "dtype", "dims"]
    pd.testing.assert_frame_equal(
        rows.sort_values(key)[[*key, "latency_ms"]].reset_index(drop=True),
        exported.sort_values(key)[[*key, "latency_ms"]].reset_index(drop=True))


def test_cli_runs_batched_and_writes_the_commit_it_was_given(sweep_dir: Path,
                                                             tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    out = tmp_path / "bench.parquet"
    code = bench_cli.main([
        "bench", "--device", "cpu", "--backend", "torch", "--sweep", str(sweep_dir),
        "--samples", "4", "--precisions", "fp32,bf16", "--batch-size", "4", "--repeats", "2",
        "--db", f"sqlite:///{tmp_path / 'b.db'}", "--export", str(out), "--commit", "c0ffee1",
        "--budget-minutes", "2"])
    assert code == bench_cli.EXIT_DONE
    sidecar = json.loads(out.with_suffix(".json").read_text())
    assert sidecar["commit"] == "c0ffee1" and sidecar["rows"] == 8
    assert {f["family"] for f in sidecar["families"]} == {
        "gemm/fp32", "gemm/bf16", "softmax/fp32", "softmax/bf16"}
    printed = capsys.readouterr()
    assert "rows/min" in printed.out and "gemm/bf16" in printed.err


POOL_WITH_A_BAD_OP = """
kernel: pool
ops: [maxpool, lppool]
dims: {batch: 1, channels: {log: [1, 8]}, h: {int: [4, 12]}, w: {int: [4, 12]}, kernel_h: 2,
       kernel_w: 2, stride_h: 2, stride_w: 2}
limits: {cpu: {max_flops: 1.0e6, max_bytes: 1.0e6}}
"""


def test_a_failing_item_costs_only_itself(tmp_path: Path, store: PerfStore) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "pool.yaml").write_text(POOL_WITH_A_BAD_OP)
    lines: list[str] = []
    report = runner.run_bench(
        settings(specs, backend="torch", samples=8, precisions=("fp32",), batch=BATCH), store,
        target=TARGET, log=lines.append)
    frame = store.measurements(run_id=report.run_id)
    # lppool has no torch layer: those items are skipped, the maxpool ones of their batches
    # are measured one by one.
    assert set(frame["op"]) == {"maxpool"} and report.skipped == 8 - len(frame) > 0
    assert any("failed: pool op 'lppool'" in line for line in lines)
    # Every family ran out of items: the run is done, and says how many it skipped.
    assert report.status == "done" and report.rows_total == len(frame)


def test_precisions_need_the_torch_backend(sweep_dir: Path, store: PerfStore) -> None:
    with pytest.raises(errors.InvalidRequestError, match="needs --backend torch"):
        runner.run_bench(settings(sweep_dir, precisions=ALL), store, target=TARGET)


def test_per_row_protocol_measures_precisions_too(sweep_dir: Path, store: PerfStore) -> None:
    report = runner.run_bench(settings(sweep_dir, backend="torch", samples=2, precisions=ALL),
                              store, target=TARGET)
    frame = store.measurements(run_id=report.run_id)
    assert report.status == "done" and len(frame) == report.planned
    assert set(frame["dtype"]) == {"float32", "bfloat16"}
