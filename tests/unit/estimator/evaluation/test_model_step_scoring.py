"""Predictions of the GPU campaign's cases, and their scoring against measured rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan_estimator.evaluation import model_step_scoring as scoring
from gpuplan_estimator.evaluation import model_steps
from gpuplan_estimator.interfaces.cli import main as cli

DEVICE = "h100-sxm-80gb"


def _measured(forward_ms: float, step_ms: float, peak: int | None,
              attention: str | None = "eager") -> dict:
    def timed(ms: float) -> dict:
        return {"median_ms": ms, "p10_ms": ms, "p90_ms": ms}

    return {"kind": "model_step", "model": "gpt2-tiny", "batch": 2, "precision": "fp32",
            "status": "ok", "attention": attention, "inference": {"forward": timed(forward_ms)},
            "tf32": {"matmul": False, "cudnn": True},
            "train": {"forward": timed(step_ms * 0.3), "backward": timed(step_ms * 0.6),
                      "optimizer": timed(step_ms * 0.1), "step": timed(step_ms),
                      "peak_memory_bytes": peak}}


@pytest.fixture(scope="module")
def predicted() -> dict:
    from gpuplan_estimator import devices

    spec = devices.resolve_device(DEVICE)
    return scoring.predict(model_steps.SMOKE_CASES[:1], [spec], ["fp32", "fp32-ieee", "bf16"], None)


def test_each_case_is_priced_per_precision_with_its_basis_and_intervals(predicted: dict) -> None:
    rows = [r for r in predicted["rows"] if r["attention"] == "eager"]
    assert [(r["model"], r["precision"], r["device"]) for r in rows] == [
        ("gpt2-tiny", "fp32", DEVICE), ("gpt2-tiny", "fp32-ieee", DEVICE),
        ("gpt2-tiny", "bf16", DEVICE)]
    for r in rows:
        assert r["data_basis"] in {"measured", "probed", "extrapolated", "roofline"}
        for phase in scoring.PHASES:
            low, high = r[f"{phase}_interval_ms"]
            assert 0 < low <= r[f"{phase}_ms"] <= high
        assert r["forward_backward_ms"] < r["train_step_ms"]
    fp32, _, bf16 = rows
    assert bf16["train_step_ms"] != fp32["train_step_ms"]  # tensor cores price bf16 apart


def test_each_case_is_priced_with_eager_and_with_fused_attention(predicted: dict) -> None:
    by = {(r["precision"], r["attention"]): r for r in predicted["rows"]}
    assert set(by) == {(p, a) for p in ("fp32", "fp32-ieee", "bf16") for a in ("eager", "fused")}
    for precision in ("fp32", "bf16"):
        eager, fused = by[(precision, "eager")], by[(precision, "fused")]
        # The same GEMMs without the scale, mask and softmax kernels.
        assert fused["inference_forward_ms"] < eager["inference_forward_ms"]
        # At sequence 16 < head dim 32 the output it keeps outweighs the probabilities (the
        # training peak of so small a model may be its optimizer step, which neither changes);
        # inference never holds the scores, so never more.
        assert fused["train_memory_bytes"] >= eager["train_memory_bytes"]
        assert fused["inference_memory_bytes"] <= eager["inference_memory_bytes"]


@pytest.mark.parametrize(("implementation", "attention"), [
    ("eager", "eager"), ("sdpa", "fused"), ("flash_attention_2", "fused"), (None, "eager")])
def test_a_measured_row_meets_the_prediction_of_the_attention_it_ran(
        predicted: dict, implementation: str | None, attention: str) -> None:
    p = next(r for r in predicted["rows"]
             if r["precision"] == "fp32" and r["attention"] == attention)
    head = {"kind": "provenance", "device": "cuda", "device_name": DEVICE}
    measured = [head, _measured(p["inference_forward_ms"], p["train_step_ms"], None,
                                implementation)]
    (row,) = scoring.score(predicted, measured, lambda n: DEVICE)
    assert row["attention"] == attention
    assert row["train_step"]["error"] == pytest.approx(0.0)


def test_measured_rows_are_joined_on_the_device_nvml_names(predicted: dict) -> None:
    p = next(r for r in predicted["rows"] if r["precision"] == "fp32" and r["attention"] == "eager")
    head = {"kind": "provenance", "device": "cuda",
            "nvml": {"name": "NVIDIA H100 80GB HBM3"}}
    measured = [head, _measured(p["inference_forward_ms"] / 2, p["train_step_ms"], 2 * 10**9),
                {**_measured(1.0, 1.0, None), "status": "out of memory"}]
    seen: list[str] = []

    def resolve(name: str) -> str:
        seen.append(name)
        return DEVICE

    (row,) = scoring.score(predicted, measured, resolve)
    assert seen == ["NVIDIA H100 80GB HBM3"]
    assert row["inference_forward"]["error"] == pytest.approx(1.0)  # predicted twice as slow
    assert row["train_step"]["error"] == pytest.approx(0.0)
    assert row["train_step"]["inside"] is True
    assert row["train_memory"]["measured_bytes"] == 2 * 10**9
    by = {(s["precision"], s["phase"]): s for s in scoring.summary([row])}
    assert by[("all", "inference_forward")]["mape_pct"] == pytest.approx(100.0)
    assert "| gpt2-tiny | 2 | fp32 | eager |" in scoring.markdown([row])


def test_a_measurement_without_provenance_is_refused(predicted: dict) -> None:
    with pytest.raises(ValueError, match="provenance"):
        scoring.score(predicted, [_measured(1.0, 1.0, None)], lambda n: DEVICE)


def test_score_command_writes_the_tables(predicted: dict, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "p.json").write_text(json.dumps(predicted))
    lines = [{"kind": "provenance", "device": "cuda", "device_name": DEVICE},
             _measured(1.0, 5.0, None)]
    (tmp_path / "m.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    code = cli.main(["eval", "model-step-scoring", "score", "--predicted",
                     str(tmp_path / "p.json"), "--measured", str(tmp_path / "m.jsonl"),
                     "--markdown", str(tmp_path / "t.md")])
    assert code == 0
    assert "| fp32 | train_step | 1 |" in (tmp_path / "t.md").read_text()


def test_predict_command_prices_the_smoke_cases_a_cpu_rehearsal_runs(tmp_path: Path) -> None:
    out = tmp_path / "p.json"
    code = cli.main(["eval", "model-step-scoring", "predict", "--device", DEVICE, "--cases",
                     "smoke", "--models", "gpt2-tiny", "--precisions", "fp32", "--out", str(out)])
    assert code == 0
    doc = json.loads(out.read_text())
    assert {(r["model"], r["attention"]) for r in doc["rows"]} == {
        ("gpt2-tiny", "eager"), ("gpt2-tiny", "fused")}
    assert "--cases smoke" in doc["provenance"]["command"]


def test_step_spread_folds_widen_their_case_and_none_is_recorded(tmp_path: Path) -> None:
    def run(*flags: str) -> dict:
        out = tmp_path / "p.json"
        code = cli.main(["eval", "model-step-scoring", "predict", "--device", DEVICE, "--cases",
                         "smoke", "--models", "gpt2-tiny", "--precisions", "fp32", "--out",
                         str(out), *flags])
        assert code == 0
        return json.loads(out.read_text())

    folds = tmp_path / "folds.json"
    spread = {"train": dict.fromkeys(("fp32", "tf32", "half"), 0.0),
              "inference": {"fp32": 0.5, "tf32": 0.0, "half": 0.0}}
    folds.write_text(json.dumps({"gpt2-tiny": spread}))
    raw, widened = run("--no-step-spread"), run("--step-folds", str(folds))
    assert (raw["step_spread"], widened["step_spread"]) == ("none", "folds")
    for a, b in zip(raw["rows"], widened["rows"], strict=True):
        assert b["train_step_interval_ms"] == a["train_step_interval_ms"]
        assert b["inference_forward_interval_ms"][1] > a["inference_forward_interval_ms"][1]
        assert b["inference_forward_ms"] == a["inference_forward_ms"]
    folds.write_text(json.dumps({"gpt2-tiny": {"train": spread["train"]}}))
    with pytest.raises(Exception, match=r"folds.json: gpt2-tiny.inference"):
        scoring.run_predict(scoring.PredictSettings(
            devices=(DEVICE,), precisions=("fp32",), cases="smoke", models=("gpt2-tiny",),
            bundle=None, out=tmp_path / "x.json", host_folds=None, step_folds=folds), "cmd")


def test_whole_steps_become_residuals_with_their_intervals(predicted: dict) -> None:
    lines = [{"kind": "provenance", "device": "cuda", "device_name": DEVICE},
             _measured(1.0, 5.0, None)]
    rows = scoring.step_residuals(scoring.score(predicted, lines, lambda n: DEVICE))
    assert [(r.group, r.kind, r.math, r.measured_ms) for r in rows] == [
        ("gpt2-tiny", "train", "fp32", 5.0), ("gpt2-tiny", "inference", "fp32", 1.0)]
    (p,) = [p for p in predicted["rows"] if p["precision"] == "fp32" and
            p["attention"] == "eager"]
    assert rows[0].predicted_ms == p["train_step_ms"]
    assert rows[0].interval_ms == tuple(p["train_step_interval_ms"])


@pytest.mark.parametrize(("switches", "precision"), [
    ({"matmul": False, "cudnn": True}, "fp32"), ({"matmul": False, "cudnn": False}, "fp32-ieee"),
    (None, "fp32-ieee")])
def test_an_fp32_row_is_scored_against_the_convolution_math_it_ran(
        predicted: dict, switches: dict | None, precision: str) -> None:
    p = next(r for r in predicted["rows"]
             if r["precision"] == precision and r["attention"] == "eager")
    head = {"kind": "provenance", "device": "cuda", "device_name": DEVICE}
    row = {**_measured(p["inference_forward_ms"], p["train_step_ms"], None), "tf32": switches}
    (scored,) = scoring.score(predicted, [head, row], lambda n: DEVICE)
    assert scored["precision"] == precision
    assert scored["train_step"]["error"] == pytest.approx(0.0)
