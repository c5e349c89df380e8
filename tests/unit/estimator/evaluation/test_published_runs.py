"""Published multi-GPU runs (#34): the data file's shapes and layouts are the published ones,
and a run is priced through the planner's layout model with throughput in tokens/s per GPU
(and Megatron's eq. (3) TFLOP/s, the same formula for published and predicted)."""

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


def _run(model: str) -> published_runs.PublishedRun:
    _, runs = published_runs.load_runs(_document())
    return next(r for r in runs if r.model == model)


def test_every_run_has_its_published_setup_and_a_citation() -> None:
    citations, runs = published_runs.load_runs(_document())
    assert "llm-foundry" in citations["mosaicml-mpt"] and "061f2c7" in citations["mosaicml-mpt"]
    assert "2104.04473" in citations["megatron-sc21"] and "Table 1" in citations["megatron-sc21"]
    assert {r.source for r in runs} == set(citations)
    for run in runs:
        assert run.dp * run.tp * run.pp == run.gpus
        assert run.global_batch == run.dp * run.micro_batch * run.grad_accum
        assert run.tokens_per_s_per_gpu > 0
        published = run.mfu_pct if run.source == "mosaicml-mpt" else run.tflops_per_gpu
        assert published is not None and published > 0


def test_megatron_throughput_is_table_1_through_eq_3() -> None:
    """The 1.7B row: 137 TFLOP/s per GPU on 32 GPUs is a step of F / (137e12 x 32) seconds
    (F = 96·B·s·l·h²·(1 + s/6h + V/16lh), Narayanan et al. 2021 eq. (3)), i.e. 9,288
    tokens/s per GPU at batch 512 x 2048 tokens."""
    run = _run("gpt-1.7b")
    assert (run.hidden, run.heads, run.layers, run.tp, run.pp, run.gpus, run.global_batch) == (
        2304, 24, 24, 1, 1, 32, 512)
    flops = 96 * 512 * 2048 * 24 * 2304**2 * (1 + 2048 / (6 * 2304) + 51200 / (16 * 24 * 2304))
    assert run.megatron_flops_per_step == pytest.approx(flops)
    step_s = flops / (137e12 * 32)
    assert run.tokens_per_s_per_gpu == pytest.approx(512 * 2048 / step_s / 32)
    assert run.tokens_per_s_per_gpu == pytest.approx(9288, abs=1)


def test_the_megatron_model_has_the_paper_s_parameter_count() -> None:
    """Eq. (2): P = 12·l·h²·(1 + 13/12h + (V + s)/12lh), the GPT-2 graph's weights."""
    run = _run("gpt-1.7b")
    g = graph.load_at_batch(exporting.hf_config_graph(run.config, batch=1, sequence=2048,
                                                      label=run.model), 1, {SEQUENCE_DIM: 2048})
    h, lyr, v, s = run.hidden, run.layers, run.setup.vocab_size, run.sequence
    paper = 12 * lyr * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * lyr * h))
    assert g.parameter_count == pytest.approx(paper, rel=1e-3)


@pytest.mark.parametrize("model", ["mpt-125m", "mpt-350m"])
def test_the_built_model_has_the_published_parameter_count(model: str) -> None:
    shape = _document()["sources"]["mosaicml-mpt"]["models"][model]
    g = graph.load_at_batch(exporting.hf_config_graph(_run(model).config, batch=1,
                                                      sequence=2048, label=model),
                            1, {SEQUENCE_DIM: 2048})
    # MPT has no biases; the GPT-2 graph has them (about 0.1 % of the weights).
    assert g.parameter_count == pytest.approx(shape["num_params"], rel=2e-3)


def test_a_run_is_priced_by_its_layout_and_fsdp_in_tokens_per_second_per_gpu() -> None:
    run = _run("mpt-125m")
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


def test_a_model_parallel_run_is_priced_by_its_degrees_schedule_and_checkpointing() -> None:
    """gpt-76.1b: tp 8 x pp 4 x dp 32, interleaved with 3 chunks, every layer recomputed; its
    TFLOP/s are eq. (3) over the predicted step, so they err exactly as its tokens/s do."""
    run = _run("gpt-76.1b")
    row = published_runs.predict(run, published_runs.context(None))
    layout = row.setup.layout
    assert (layout.dp, layout.tp, layout.pp, layout.virtual_stages) == (32, 8, 4, 3)
    assert row.setup.strategy.checkpointing == "full"
    assert row.setup.parts_ms["recompute"] > 0 and row.setup.parts_ms["pp_bubble"] > 0
    assert run.tflops_per_gpu is not None
    assert row.tflops_per_gpu / run.tflops_per_gpu == pytest.approx(
        row.tokens_per_s_per_gpu / run.tokens_per_s_per_gpu)
    text = published_runs.table([row])
    assert "interleaved x3" in text and "megatron-sc21" in text


def _cli_args(run: published_runs.PublishedRun, config: Path) -> list[str]:
    s = run.setup
    schedule = f"interleaved:{run.virtual_stages}" if run.virtual_stages > 1 else "1f1b"
    fsdp = [] if s.fsdp == "none" else ["--fsdp", s.fsdp]  # the flag's default is none
    return ["estimate", "--hf-config", str(config), "--batch", str(run.global_batch),
            "--dim", f"sequence={run.sequence}", "--device", run.device, "--mode", "train",
            "--precision", s.precision, "--optimizer", s.optimizer, "--attention", s.attention,
            "--gpus", str(run.gpus), "--dp", str(run.dp), "--tp", str(run.tp), "--pp",
            str(run.pp), "--gpus-per-node", str(s.gpus_per_node), "--pp-schedule", schedule,
            *fsdp, "--checkpointing", s.checkpointing, "--micro-batch",
            str(run.micro_batch), "--grad-accum", str(run.grad_accum), "-o", "json"]


@pytest.mark.parametrize("model", ["mpt-125m", "gpt-76.1b"])
def test_a_run_prices_exactly_what_the_user_s_named_layout_does(
        model: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The table's row and `gpuplan estimate --gpus N --dp D --tp T --pp P ...` of the same
    run: the same step, parts, memory and throughput, to the last digit."""
    run = _run(model)
    row = published_runs.predict(run, published_runs.context(None))
    config = tmp_path / f"{model}.json"
    config.write_text(json.dumps(run.config), encoding="utf-8")
    assert main.main(_cli_args(run, config)) == 0
    (cli,) = json.loads(capsys.readouterr().out)["layout_estimates"]
    assert cli["step_time_ms"] == row.setup.step_ms
    assert cli["step_parts_ms"] == dict(row.setup.parts_ms)
    assert cli["memory_per_rank"] == row.setup.memory.as_dict()
    assert cli["throughput"]["tokens_per_s_per_gpu"] == row.tokens_per_s_per_gpu
