"""Whole-model step campaign (issue #18 part 4), run for real on the CPU with tiny configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan_estimator.evaluation import model_steps

pytest.importorskip("transformers")  # the `torch` extra; `make install` has it


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_smoke_campaign_times_every_phase_and_records_where_it_ran(tmp_path: Path) -> None:
    out = tmp_path / "steps.jsonl"
    code = model_steps.main(["--device", "cpu", "--cases", "smoke", "--precisions", "fp32",
                             "--warmup", "1", "--repeats", "3", "--out", str(out),
                             "--commit", "abc123"])
    assert code == 0
    head, *rows = _rows(out)
    assert head["kind"] == "provenance" and head["commit"] == "abc123"
    assert head["command"].startswith(f"python -m {model_steps.MODULE} --device cpu")
    assert head["torch"] and head["transformers"] and head["date"]
    assert [(r["model"], r["status"]) for r in rows] == [("gpt2-tiny", "ok"), ("bert-tiny", "ok")]
    for r in rows:
        assert r["parameters"] > 0 and r["attention"]  # e.g. "sdpa" or "eager"
        timed = [r["inference"]["forward"], *(r["train"][k] for k in
                                              ("forward", "backward", "optimizer", "step"))]
        for t in timed:
            assert 0 < t["p10_ms"] <= t["median_ms"] <= t["p90_ms"]
        # Each repeat's step is the sum of its parts, so it dominates every part's order
        # statistics (the medians need not add up).
        for k in ("forward", "backward", "optimizer"):
            assert r["train"]["step"]["median_ms"] >= r["train"][k]["median_ms"]


def test_configurations_past_the_budget_are_written_as_skipped_not_run(tmp_path: Path) -> None:
    ticks = iter([0.0, 0.0, 99.0, 99.0, 99.0])  # deadline at 10: the first one runs
    rows: list[dict] = []
    settings = model_steps.RunSettings("cpu", ("fp32",), warmup=0, repeats=1, budget_s=10.0)
    counts = model_steps.run(model_steps.SMOKE_CASES, settings, rows.append,
                             clock=lambda: next(ticks))
    assert counts == {"ok": 1, "skipped": 1}
    assert rows[1]["status"].startswith("skipped") and "train" not in rows[1]


def test_one_broken_configuration_is_recorded_and_the_rest_still_run() -> None:
    broken = model_steps.ModelCase("broken", "causal-lm", "gpt2", {"n_layer": 1, "n_embd": 63,
                                   "n_head": 2, "vocab_size": 8}, (1,), sequence=4)
    rows: list[dict] = []
    settings = model_steps.RunSettings("cpu", ("fp32",), warmup=0, repeats=1, budget_s=60.0)
    counts = model_steps.run((broken, model_steps.SMOKE_CASES[0]), settings, rows.append)
    assert counts == {"error": 1, "ok": 1}
    assert rows[0]["status"].startswith("error: ")


def test_smaller_batches_of_every_model_come_before_larger_ones() -> None:
    order = [(c.name, b) for c, b, p in model_steps.configurations(model_steps.FULL_CASES,
                                                                   ("fp32",))]
    firsts = {name for name, _ in order[:len(model_steps.FULL_CASES)]}
    assert firsts == {c.name for c in model_steps.FULL_CASES}
    assert len(order) == sum(len(c.batches) for c in model_steps.FULL_CASES)


@pytest.mark.parametrize("argv, message", [
    (["--precisions", "fp8"], "--precisions"),
    (["--models", "gpt5"], "--models"),
    (["--repeats", "0"], "--repeats"),
    (["--device", "tpu"], "--device"),
])
def test_bad_arguments_name_the_flag(argv: list[str], message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        model_steps.main([*argv, "--out", str(tmp_path / "x.jsonl")])
    assert message in capsys.readouterr().err
