"""Progress of long work: the library reports every step to a callback, the CLI draws bars on a
terminal only (never into a pipe or a log) and not at all with --no-progress."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpuplan_estimator import devices
from gpuplan_estimator.bench import runner
from gpuplan_estimator.core import measurements, progress
from gpuplan_estimator.cost import features
from gpuplan_estimator.interfaces.cli import bench as bench_cli
from gpuplan_estimator.interfaces.cli import main as cli_main
from gpuplan_estimator.interfaces.cli.progress import TerminalProgress
from gpuplan_estimator.perfdb.store import PerfStore
from gpuplan_estimator.training import fitting
from gpuplan_testing.bench_fixtures import TARGET, settings

FAST = {"n_estimators": 10, "num_leaves": 7, "min_child_samples": 5, "n_jobs": 1}


class _Terminal(io.StringIO):
    """A stream that says it is a terminal, as stderr does in an interactive shell."""

    def isatty(self) -> bool:
        return True


def _draw(stream: io.StringIO, *, enabled: bool) -> str:
    with TerminalProgress(enabled=enabled, stream=stream) as shown:
        for step in (progress.Step("fit kernels", 0, 2), progress.Step("fit kernels", 1, 2, "gemm"),
                     progress.Step("fit kernels", 2, 2, "softmax")):
            shown(step)
    return stream.getvalue()


def test_bars_are_drawn_on_a_terminal() -> None:
    text = _draw(_Terminal(), enabled=True)
    assert "fit kernels" in text and "0/2" in text  # later redraws wait for mininterval


@pytest.mark.parametrize(("stream", "enabled"), [(io.StringIO(), True), (_Terminal(), False)],
                         ids=["not-a-tty", "no-progress"])
def test_no_bar_without_a_terminal_or_with_no_progress(stream: io.StringIO, enabled: bool) -> None:
    assert _draw(stream, enabled=enabled) == ""


def test_track_reports_the_start_and_each_finished_item() -> None:
    seen: list[progress.Step] = []
    done_before_report: list[int] = []
    for _item in progress.track(["a", "b"], "task", seen.append):
        done_before_report.append(len(seen))  # the item's step comes after its work
    assert done_before_report == [1, 2]
    assert seen == [progress.Step("task", 0, 2), progress.Step("task", 1, 2, "a"),
                    progress.Step("task", 2, 2, "b")]


def _softmax_rows(device: str, rows: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    spec = devices.load_catalog().resolve(device)
    dims = {"rows": rng.integers(1, 4096, rows), "cols": rng.integers(8, 4096, rows)}
    dtype = np.full(rows, "float32")
    base = features.base_ms(features.WorkColumns("softmax", dims, dtype, np.full(rows, "softmax")),
                            features.broadcast_device(spec, dtype, 0))
    return pd.DataFrame({
        "device": device, "backend": "pytorch-2.1.0+cu121", "kernel": "softmax", "op": "softmax",
        "dtype": "float32",
        "dims": [measurements.dims_to_json({k: int(v[i]) for k, v in dims.items()})
                 for i in range(rows)],
        "latency_ms": base * 1.5, "latency_std_ms": np.nan, "repeats": 25, "source": "synth"})


def test_training_reports_each_kernel_fit() -> None:
    frame = pd.concat([_softmax_rows("t4", 120, 0), _softmax_rows("v100-pcie-32gb", 120, 1)],
                      ignore_index=True)
    seen: list[progress.Step] = []
    fitting.train_bundle(frame, fitting.TrainSettings(model_params=FAST, min_rows_per_kernel=50),
                         validate=False, progress=seen.append)
    assert seen == [progress.Step("fit kernels", 0, 1),
                    progress.Step("fit kernels", 1, 1, "softmax (gpu)")]


def test_bench_reports_each_measured_row(sweep_dir: Path, store: PerfStore) -> None:
    seen: list[progress.Step] = []
    report = runner.run_bench(settings(sweep_dir, samples=3), store, target=TARGET,
                              progress=seen.append)
    assert report.rows_added == 3
    assert [(s.task, s.done, s.total) for s in seen] == [
        ("bench cpu", 0, 3), ("bench cpu", 1, 3), ("bench cpu", 2, 3), ("bench cpu", 3, 3)]
    assert all(s.item.split()[0] in {"gemm", "softmax"} for s in seen[1:])


def test_bench_cli_draws_no_bar_into_a_pipe(
    sweep_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(runner, "resolve_target", lambda device: TARGET)
    code = bench_cli.main(["bench", "--samples", "3", "--repeats", "2", "--sweep",
                           str(sweep_dir), "--db", f"sqlite:///{tmp_path / 'c.db'}"])
    assert code == 0
    captured = capsys.readouterr()
    assert "3 rows added" in captured.out
    assert "bench cpu" not in captured.err and "%|" not in captured.err


@pytest.mark.parametrize("command", [["train", "--shipped"], ["eval"], ["bench"]])
def test_every_long_subcommand_takes_no_progress(command: list[str]) -> None:
    args = cli_main.build_parser().parse_args([*command, "--no-progress"])
    assert args.no_progress is True
