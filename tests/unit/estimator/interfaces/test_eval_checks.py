"""`gpuplan eval CHECK`: each check's flags reach its module's `run` as typed settings, and a bad
flag is a usage error (exit 2) that names it. The modules' `run` is replaced by a recorder here:
what is under test is the parsing, not the (minutes-long) checks, which have their own tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuplan_estimator.core.exit_codes import ExitCode
from gpuplan_estimator.evaluation import (
    host_check,
    memory_check,
    model_step_scoring,
    parallel_check,
    plans_report,
    speed,
    stream_check,
    sub_wave_check,
    transfer_check,
)
from gpuplan_estimator.interfaces.cli import eval_checks, main


def _record(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[tuple[Any, ...]]:
    calls: list[tuple[Any, ...]] = []

    def run(*args: Any, **kwargs: Any) -> int:
        calls.append((*args, *kwargs.values()))
        return 0

    monkeypatch.setattr(module, name, run)
    return calls


def _usage_error(argv: list[str], capsys: pytest.CaptureFixture[str], flag: str) -> None:
    assert main.main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.startswith("gpuplan: error:") and flag in err, err


def test_every_check_is_a_subcommand_of_eval() -> None:
    parser = main.build_parser(plugins="eval")
    for check in eval_checks.CHECKS:
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["eval", check, "--help"])
        assert exc.value.code == 0


def test_plans_report(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                      capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, plans_report, "run")
    assert main.main(["eval", "plans-report", "--out", str(tmp_path / "p.md")]) == 0
    (settings, document), = calls
    assert settings == plans_report.PlansReportSettings(out=tmp_path / "p.md")
    assert callable(document)
    assert main.main(["eval", "plans-report"]) == 0
    assert calls[1][0].out == plans_report.DEFAULT_OUT
    _usage_error(["eval", "plans-report", "--pages", "x"], capsys, "--pages")


def test_speed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
               capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, speed, "run")
    config = tmp_path / "gpt2.json"
    assert main.main(["eval", "speed", "--json", "--repeats", "5",
                      "--gpt2-config", str(config)]) == 0
    assert calls == [(speed.SpeedSettings(json=True, repeats=5, gpt2_config=config),)]
    _usage_error(["eval", "speed", "--repeats", "many"], capsys, "--repeats")


def test_memory_check(monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, memory_check, "run")
    assert main.main(["eval", "memory-check"]) == 0
    assert calls == [()]
    _usage_error(["eval", "memory-check", "--cases", "x"], capsys, "--cases")


def test_parallel_check(monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, parallel_check, "run")
    assert main.main(["eval", "parallel-check", "--bundle", "/b"]) == 0
    assert main.main(["eval", "parallel-check"]) == 0
    assert calls == [(parallel_check.ParallelCheckSettings(bundle="/b"),),
                     (parallel_check.ParallelCheckSettings(bundle=None),)]
    _usage_error(["eval", "parallel-check", "--bundel", "/b"], capsys, "--bundel")


def test_model_step_scoring_predict(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, model_step_scoring, "run_predict")
    out = tmp_path / "p.json"
    assert main.main(["eval", "model-step-scoring", "predict", "--device", "t4", "--device",
                      "l4", "--cases", "smoke", "--models", "gpt2-tiny,", "--precisions",
                      "fp32,bf16", "--out", str(out)]) == 0
    (settings, command), = calls
    assert settings == model_step_scoring.PredictSettings(
        devices=("t4", "l4"), precisions=("fp32", "bf16"), cases="smoke",
        models=("gpt2-tiny",), bundle=None, out=out, host_folds=None)
    assert command == ("gpuplan eval model-step-scoring predict --device t4 --device l4 "
                       f"--precisions fp32,bf16 --cases smoke --models gpt2-tiny --out {out}")
    assert main.main(["eval", "model-step-scoring", "predict", "--device", "t4",
                      "--out", str(out)]) == 0
    assert calls[1][0].precisions == model_step_scoring.PREDICTED_PRECISIONS
    assert calls[1][0].cases == "full"
    _usage_error(["eval", "model-step-scoring", "predict", "--device", "t4", "--cases", "huge",
                  "--out", str(out)], capsys, "--cases")
    _usage_error(["eval", "model-step-scoring", "predict", "--device", "t4"], capsys, "--out")
    assert main.main(["eval", "model-step-scoring", "predict", "--device", "t4", "--out",
                      str(out), "--no-step-spread"]) == 0
    assert calls[2][0].no_step_spread and calls[2][1].endswith("--no-step-spread")
    _usage_error(["eval", "model-step-scoring", "predict", "--device", "t4", "--out", str(out),
                  "--no-step-spread", "--step-folds", "f.json"], capsys, "--step-folds")


def test_model_step_scoring_score(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, model_step_scoring, "run_score")
    assert main.main(["eval", "model-step-scoring", "score", "--predicted", "p.json",
                      "--measured", "m.jsonl"]) == 0
    assert calls == [(model_step_scoring.ScoreSettings(
        predicted=Path("p.json"), measured=Path("m.jsonl"), markdown=None),)]
    _usage_error(["eval", "model-step-scoring", "score", "--predicted", "p.json"], capsys,
                 "--measured")
    _usage_error(["eval", "model-step-scoring"], capsys, "predict|score")


def test_host_check(monkeypatch: pytest.MonkeyPatch,
                    capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, host_check, "run")
    assert main.main(["eval", "host-check", "--steps", "a.jsonl", "--steps", "b.jsonl",
                      "--probe", "probe.json", "--folds", "folds.json"]) == 0
    assert calls == [(host_check.HostCheckSettings(
        steps=(Path("a.jsonl"), Path("b.jsonl")), probe=Path("probe.json"), json=None,
        folds=Path("folds.json")),)]
    _usage_error(["eval", "host-check", "--steps", "a.jsonl"], capsys, "--probe")
    calls.clear()
    assert main.main(["eval", "host-check", "--steps", "a.jsonl", "--event-steps", "run1.jsonl",
                      "--probe", "probe.json"]) == 0
    assert calls == [(host_check.HostCheckSettings(
        steps=(Path("a.jsonl"),), probe=Path("probe.json"), json=None, folds=None,
        event_steps=(Path("run1.jsonl"),)),)]


def test_stream_check(monkeypatch: pytest.MonkeyPatch,
                      capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, stream_check, "run")
    assert main.main(["eval", "stream-check", "--steps", "a.jsonl", "--bundle", "b"]) == 0
    assert calls == [(stream_check.StreamCheckSettings(steps=(Path("a.jsonl"),), bundle="b"),)]
    _usage_error(["eval", "stream-check"], capsys, "--steps")


def test_sub_wave_check(monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, sub_wave_check, "run")
    assert main.main(["eval", "sub-wave-check", "--max-rows", "900", "--bench", "x.parquet"]) == 0
    assert calls == [(sub_wave_check.SubWaveCheckSettings(
        max_rows=900, seed=0, bench=(Path("x.parquet"),)),)]
    _usage_error(["eval", "sub-wave-check", "--seed", "zero"], capsys, "--seed")


def test_transfer_check(monkeypatch: pytest.MonkeyPatch,
                        capsys: pytest.CaptureFixture[str]) -> None:
    calls = _record(monkeypatch, transfer_check, "run")
    assert main.main(["eval", "transfer-check", "--kernels", "gemm,softmax", "--no-models",
                      "--probe-seed", "7"]) == 0
    assert calls == [(transfer_check.TransferCheckSettings(
        kind="tiled", max_rows=3000, op_max_rows=8000, kernels=("gemm", "softmax"), ops=True,
        models=False, probe_seed=7),)]
    _usage_error(["eval", "transfer-check", "--kind", "magic"], capsys, "--kind")


def test_an_unknown_check_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    _usage_error(["eval", "plans-reprot"], capsys, "plans-reprot")
