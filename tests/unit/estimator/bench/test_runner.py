"""Resumable benchmark runs on CPU with real onnxruntime and a SQLite store; the CLI in-process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpuplan_estimator.bench import nvml, runner, sweep, timing
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.measurements import MEASUREMENT_COLUMNS
from gpuplan_estimator.interfaces.cli import bench as cli
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_testing.bench_fixtures import TARGET, settings


def test_run_measures_the_plan_and_a_rerun_adds_nothing(sweep_dir: Path, store: PerfStore) -> None:
    first = runner.run_bench(settings(sweep_dir), store, target=TARGET)
    assert (first.status, first.rows_added, first.planned, first.resumed) == ("done", 8, 8, False)
    frame = store.measurements(run_id=first.run_id)
    assert len(frame) == 8 and set(frame["kernel"]) == {"gemm", "softmax"}
    assert (frame["latency_ms"] > 0).all() and (frame["repeats"] == 2).all()
    assert (frame["latency_min_ms"] <= frame["latency_ms"]).all()
    assert set(frame["backend"]) == {runner.backend_name("onnxruntime", "cpu")}
    (run,) = store.runs()
    recorded = json.loads(run.settings_json)
    assert recorded["timing"]["intra_op_threads"] == timing.available_cores()
    assert run.status == "done" and run.git_commit and len(json.loads(run.plan_json)) == 8
    again = runner.run_bench(settings(sweep_dir), store, target=TARGET)
    assert (again.run_id, again.rows_added, again.resumed) == (first.run_id, 0, True)
    assert len(store.measurements()) == 8
    assert store.devices()["key"].tolist() == ["cpu"]


def test_budget_stop_is_resumable(sweep_dir: Path, store: PerfStore) -> None:
    ticks = iter(range(10_000))

    def clock() -> float:  # one "minute" per reading: the budget runs out after a few rows
        return float(next(ticks)) * 60.0

    cut = runner.run_bench(settings(sweep_dir, budget_minutes=4.0), store, target=TARGET,
                           clock=clock)
    assert cut.status == "interrupted" and 0 < cut.rows_added < 8
    assert store.runs()[0].status == "interrupted"
    rest = runner.run_bench(settings(sweep_dir), store, target=TARGET)
    assert rest.resumed and rest.run_id == cut.run_id
    assert rest.rows_added == 8 - cut.rows_added and rest.status == "done"
    assert len(store.measurements()) == 8


def test_crash_keeps_measured_rows_and_resume_skips_them(
    sweep_dir: Path, store: PerfStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = runner.measure_item
    done: list[str] = []

    def crashing(item: sweep.PlanItem, *a: Any, **k: Any) -> dict[str, Any]:
        if len(done) == 3:
            raise KeyboardInterrupt
        done.append(sweep.dims_json(item.dims))
        return real(item, *a, **k)

    monkeypatch.setattr(runner, "measure_item", crashing)
    with pytest.raises(KeyboardInterrupt):
        runner.run_bench(settings(sweep_dir), store, target=TARGET)
    assert len(store.measurements()) == 3
    assert store.runs()[0].status == "interrupted"  # not left "running"
    monkeypatch.setattr(runner, "measure_item", real)
    rest = runner.run_bench(settings(sweep_dir), store, target=TARGET)
    assert (rest.rows_added, rest.status) == (5, "done")
    dims = store.measurements()["dims"].tolist()
    assert dims[:3] == done and len(set(dims)) == 8


def test_an_error_in_a_row_keeps_the_rows_and_marks_the_run_failed(
    sweep_dir: Path, store: PerfStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = runner.measure_item
    calls: list[int] = []

    def failing(item: sweep.PlanItem, *a: Any, **k: Any) -> dict[str, Any]:
        calls.append(1)
        if len(calls) == 5:
            raise RuntimeError("onnxruntime fell over")
        return real(item, *a, **k)

    monkeypatch.setattr(runner, "measure_item", failing)
    with pytest.raises(RuntimeError, match="fell over"):
        runner.run_bench(settings(sweep_dir), store, target=TARGET)
    assert len(store.measurements()) == 4
    (run,) = store.runs()
    assert run.status == "failed" and run.ended_at is not None


def test_stop_request_ends_the_run_after_the_current_row(
    sweep_dir: Path, store: PerfStore
) -> None:
    asked: list[int] = []

    def stop_after_three_rows() -> bool:  # asked once before each row
        asked.append(1)
        return len(asked) > 3

    cut = runner.run_bench(settings(sweep_dir), store, target=TARGET,
                           stop_requested=stop_after_three_rows)
    assert (cut.status, cut.rows_added, cut.rows_total) == ("interrupted", 3, 3)
    # Fewer than FLUSH_EVERY_ROWS rows: unless 5 s passed, they were still buffered at the stop.
    assert len(store.measurements()) == 3
    assert store.runs()[0].status == "interrupted"
    rest = runner.run_bench(settings(sweep_dir), store, target=TARGET)
    assert (rest.run_id, rest.resumed, rest.rows_added, rest.status) == (
        cut.run_id, True, 5, "done")


def test_different_seed_is_a_new_run(sweep_dir: Path, store: PerfStore) -> None:
    a = runner.run_bench(settings(sweep_dir, samples=2), store, target=TARGET)
    b = runner.run_bench(settings(sweep_dir, samples=2, seed=6), store, target=TARGET)
    assert a.run_id != b.run_id and not b.resumed


@pytest.mark.parametrize(("text", "expected"),
                         [("cpu", ("cpu", 0)), ("cuda", ("cuda", 0)), ("cuda:3", ("cuda", 3))])
def test_parse_device(text: str, expected: tuple[str, int]) -> None:
    assert runner.parse_device(text) == expected


@pytest.mark.parametrize("text", ["gpu", "cpu:1", "cuda:x", "rocm:0"])
def test_parse_device_rejects(text: str) -> None:
    with pytest.raises(errors.InvalidRequestError, match="device"):
        runner.parse_device(text)


def test_unknown_backend_is_refused() -> None:
    with pytest.raises(errors.InvalidRequestError, match="backend"):
        runner.backend_name("tensorflow", "cpu")


def test_cuda_without_nvml_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "device_identity", lambda index: None)
    with pytest.raises(errors.GpuplanError, match="NVML unavailable"):
        runner.resolve_target("cuda:0")


def test_cli_bench_exports_parquet_and_sidecar(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(runner, "resolve_target", lambda device: TARGET)
    out = tmp_path / "out" / "cpu.parquet"
    code = cli.main(["bench", "--samples", "4", "--repeats", "2", "--sweep", str(sweep_dir),
                     "--db", f"sqlite:///{tmp_path / 'c.db'}", "--export", str(out),
                     "--no-progress", "--families", "softmax", "--no-host-probe"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "4 rows added" in printed and "rows/min" in printed
    frame = pd.read_parquet(out)
    assert list(frame.columns)[: len(MEASUREMENT_COLUMNS)] == list(MEASUREMENT_COLUMNS)
    assert len(frame) == 4 and set(frame["kernel"]) == {"softmax"}
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["device"] == "cpu" and side["rows"] == 4
    assert "--families softmax" in side["command"] and side["date"]


def test_cli_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["bench", "--device", "tpu", "--db", f"sqlite:///{tmp_path / 'e.db'}"])
    assert code == 2
    assert "gpuplan: error: device" in capsys.readouterr().err


def test_register_adds_both_subcommands() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["bench", "--families", "gemm,conv2d", "--samples", "3"])
    assert args.families == ("gemm", "conv2d") and args.func is cli.run_bench_command
    args = parser.parse_args(["import", "a.parquet"])
    assert args.func is cli.run_import_command


def test_power_sampler_averages_nvml_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    class FakeNvml:  # stands in for the driver, which this machine does not have
        NVML_CLOCK_SM = 1
        readings = iter([100_000, 200_000, 300_000] + [300_000] * 1000)

        def nvmlDeviceGetClockInfo(self, h: int, kind: int) -> int:
            return 1410 if kind == self.NVML_CLOCK_SM else 0

        def nvmlInit(self) -> None: ...
        def nvmlShutdown(self) -> None: ...
        def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
            return i

        def nvmlDeviceGetPowerUsage(self, h: int) -> int:
            return next(self.readings)  # milliwatts

    monkeypatch.setattr(nvml, "pynvml", FakeNvml())
    import time

    with nvml.PowerSampler(0, interval_s=0.001) as power:
        time.sleep(0.05)
    assert power.samples_watts[:3] == [100.0, 200.0, 300.0]
    assert power.mean_watts is not None and 100.0 < power.mean_watts <= 300.0
    assert power.mean_sm_clock_mhz == 1410.0


def test_nvml_absent_is_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "pynvml", None)
    assert nvml.device_identity(0) is None
    with nvml.PowerSampler(0) as power:
        pass
    assert power.mean_watts is None
