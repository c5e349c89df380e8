"""Published multi-GPU runs (#34): the data file's shapes and layouts are the published ones,
and a run is priced through the planner's layout model with throughput in tokens/s per GPU."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuplan_estimator import graph
from gpuplan_estimator.core.vocabulary import SEQUENCE_DIM
from gpuplan_estimator.evaluation import published_runs
from gpuplan_estimator.graph import exporting
from gpuplan_estimator.interfaces.cli import main


@functools.cache
def _document() -> dict[str, Any]:
    return dict(yaml.safe_load(published_runs.DATA_FILE.read_text(encoding="utf-8")))


def test_every_run_has_its_published_setup_and_a_citation() -> None:
    source, runs = published_runs.load_runs(_document())
    assert "llm-foundry" in source and "061f2c7" in source
    assert len(runs) >= 5
    for run in runs:
        assert run.global_batch == run.gpus * run.micro_batch * run.grad_accum
        assert run.tokens_per_s_per_gpu > 0 and 0 < run.mfu_pct < 100


@pytest.mark.parametrize("model", ["mpt-125m", "mpt-350m"])
def test_the_built_model_has_the_published_parameter_count(model: str) -> None:
    shape = _document()["models"][model]
    config = published_runs.gpt2_config(shape, 2048)
    g = graph.load_at_batch(exporting.hf_config_graph(config, batch=1, sequence=2048, label=model),
                            1, {SEQUENCE_DIM: 2048})
    # MPT has no biases; the GPT-2 graph has them (about 0.1 % of the weights).
    assert g.parameter_count == pytest.approx(shape["num_params"], rel=2e-3)


def test_a_run_is_priced_by_its_layout_and_fsdp_in_tokens_per_second_per_gpu() -> None:
    _, runs = published_runs.load_runs(_document())
    run = next(r for r in runs if r.model == "mpt-125m")
    row = published_runs.predict(run, published_runs.context(None))
    setup = row.setup
    assert (setup.strategy.fsdp, setup.strategy.gradient_accumulation) == ("full", run.grad_accum)
    assert setup.layout.dp == run.gpus and setup.micro_batch == run.micro_batch
    assert setup.step_ms >= setup.parts_ms["compute"] > 0
    tokens_per_step = run.global_batch * run.sequence
    assert row.tokens_per_s_per_gpu * run.gpus * setup.step_ms / 1000 == pytest.approx(
        tokens_per_step)
    assert row.error_pct == pytest.approx(
        100 * (row.tokens_per_s_per_gpu / run.tokens_per_s_per_gpu - 1))
    assert "mpt-125m" in published_runs.table([row])


def test_a_run_prices_exactly_what_the_user_s_named_layout_does(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table's row and `gpuplan estimate --gpus 8 --fsdp full ...` of the same run: the
    same step, parts, memory and throughput, to the last digit."""
    _, runs = published_runs.load_runs(_document())
    run = next(r for r in runs if r.model == "mpt-125m")
    row = published_runs.predict(run, published_runs.context(None))
    config = tmp_path / "mpt-125m.json"
    config.write_text(json.dumps(run.config), encoding="utf-8")
    assert main.main([
        "estimate", "--hf-config", str(config), "--batch", str(run.global_batch),
        "--dim", f"sequence={run.sequence}", "--device", run.device, "--mode", "train",
        "--precision", published_runs.PRECISION, "--optimizer", published_runs.OPTIMIZER,
        "--attention", published_runs.ATTENTION, "--gpus", str(run.gpus),
        "--fsdp", published_runs.STRATEGY_FSDP, "--micro-batch", str(run.micro_batch),
        "--grad-accum", str(run.grad_accum), "-o", "json"]) == 0
    (cli,) = json.loads(capsys.readouterr().out)["layout_estimates"]
    assert cli["step_time_ms"] == row.setup.step_ms
    assert cli["step_parts_ms"] == dict(row.setup.parts_ms)
    assert cli["memory_per_rank"] == row.setup.memory.as_dict()
    assert cli["throughput"]["tokens_per_s_per_gpu"] == row.tokens_per_s_per_gpu
