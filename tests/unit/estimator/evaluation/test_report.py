"""The accuracy report for users: JSON round trip, the page's order and wording, the pictures'
data, and `gpuplan eval --from-json` re-rendering the shipped docs/accuracy.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuplan_estimator.core import paths
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.evaluation import cpu_loop, gpu_labels, pages, plots, publishing, report
from gpuplan_estimator.interfaces.cli import main as cli_main

SHIPPED_JSON = paths.REPO_ROOT / "docs" / "accuracy.json"


def _row(model: str, device: str, gpu: str, measured_ms: float, predicted_ms: float,
         predictor: str = pages.LEARNED, mode: str = "inference") -> gpu_labels.RowResult:
    forward_ms = measured_ms if mode == "inference" else measured_ms * 0.4
    row = gpu_labels.LabelRow(gpu, model, mode, 512, 8, False, measured_ms, forward_ms,
                              measured_ms - forward_ms)
    return gpu_labels.RowResult(row, device, predictor, predicted_ms, predicted_ms * 0.5,
                                predicted_ms * 1.5, predicted_ms * 0.25)


def _report(*, bundle: str = "the shipped bundle", command: str = "gpuplan eval --no-cpu",
            ) -> report.Report:
    gpu = (_row("bert", "t4", "Tesla_T4", 100.0, 110.0),          # +10 %, inside P10-P90
           _row("gpt2", "t4", "Tesla_T4", 200.0, 100.0),          # -50 %, outside
           _row("bert", "v100-pcie-32gb", "Tesla_V100-PCIE-32GB", 50.0, 60.0, mode="train"),
           _row("bert", "t4", "Tesla_T4", 100.0, 95.0, predictor=pages.CALIBRATED))
    logo = (_row("bert", "t4", "Tesla_T4", 100.0, 250.0),)  # +150 %, P10 above the label
    cpu = (cpu_loop.CpuResult("resnet50", 1, "lightgbm:conv2d", 50.0, 40.0, 60.0, 55.0, 3),
           cpu_loop.CpuResult("resnet50", 8, "lightgbm:conv2d", 80.0, 70.0, 90.0, 100.0, 3,
                              mode="train"))
    skipped = (gpu_labels.Skipped(gpu_labels.LabelRow("Tesla_T4", "moe", "inference", 512, 8,
                                                      False, 9.0, 9.0, 0.0), "no builder"),)
    return report.Report(
        measured=report.Provenance("2026-01-02T03:04:05+00:00", "abc1234", command),
        bundle=bundle, gpu=gpu, skipped=skipped, logo=logo, cpu=cpu, notes=("a method note",),
        host=report.Host("Some CPU", 2, 171.5, 19.25),
        cpu_models=(report.CpuModels("onnxruntime", "host-bench", 5845, 1.072, 48),
                    report.CpuModels("torch", "bundle", 0, 1.0, 0)))


def test_json_round_trip_keeps_every_row_and_provenance() -> None:
    rep = _report()
    doc = json.loads(json.dumps(report.to_json(rep)))
    assert doc["schema_version"] == report.SCHEMA_VERSION
    assert report.from_json(doc) == rep


def test_from_json_refuses_another_schema() -> None:
    doc = report.to_json(_report())
    with pytest.raises(InvalidRequestError, match="schema"):
        report.from_json({**doc, "schema_version": 1})
    with pytest.raises(InvalidRequestError, match="malformed"):
        report.from_json({**doc, "gpu_labels": {"rows": [{"model": "x"}]}})


def test_page_puts_headline_numbers_first_and_names_gpus() -> None:
    text = pages.to_markdown(_report(), roots={})
    headline = text.index("| GPU | rows | MAPE %")
    assert headline < text.index("## What was measured") < text.index("## Details")
    # Tesla T4: |+10| and |-50| → MAPE 30.0, one of two inside; left out: +150 %, outside
    assert "| Tesla T4 | 2 | 30.0 | 46.0 | 50 | 150.0 | 150.0 | 0 |" in text
    assert "| Tesla V100-PCIE-32GB | 1 | 20.0 |" in text
    assert text.index("accuracy-residuals.png") < text.index("## What was measured")
    assert "accuracy-coverage.png" in text
    assert "moe, 1 label rows (no builder)" in text
    assert "1.072x (onnxruntime, 48 op rows)" in text  # the noise line: measured drift only
    assert "load average" not in text
    assert "gpuplan eval --from-json docs/accuracy.json" in text
    assert "2026-01-02T03:04:05+00:00 at commit `abc1234` by `gpuplan eval --no-cpu`" in text


def test_page_has_no_path_of_the_machine_that_measured() -> None:
    rep = _report(bundle="shipped bundle /home/ci/src/gpuplan/estimator/gpuplan_estimator/data",
                  command="gpuplan eval --cpu-db sqlite:////var/cache/bench/perf.db "
                  "--labels /home/ci/shared/data/model-labels/labels.csv")
    text = pages.to_markdown(rep, roots={"/home/ci/src/gpuplan/": "",
                                         "/home/ci/shared/data/": "../shared/data/"})
    assert "/home/ci" not in text and "/var/cache" not in text
    assert "--cpu-db sqlite:///perf.db" in text
    assert "--labels ../shared/data/model-labels/labels.csv" in text
    assert "estimator/gpuplan_estimator/data" in text


def test_the_published_run_table_is_put_in_and_kept_when_the_page_is_rewritten() -> None:
    """`published_runs --accuracy-page` puts its table into the section; `gpuplan eval`
    rewriting the page (publishing.write) carries the table it finds over."""
    fresh = pages.to_markdown(_report(), roots={})
    assert pages.PUBLISHED_TABLE_PENDING in fresh and pages.published_table_of(fresh) is None
    table = "| source | model |\n|---|---|\n| megatron-sc21 | gpt-1.7b |\n\n- all: 11.5 %"
    page = pages.with_published_table(fresh, table)
    assert pages.published_table_of(page) == table
    assert page.index(pages.PUBLISHED_RUNS_HEADING) < page.index(table) < page.index(
        "## Details")
    assert page.replace(table, pages.PUBLISHED_TABLE_PENDING) == fresh  # nothing else moved
    rewritten = pages.to_markdown(_report(), roots={}, published_table=pages.published_table_of(
        page))
    assert rewritten == page
    assert pages.with_published_table(page, "| new |").count(pages.PUBLISHED_RUNS_HEADING) == 1
    with pytest.raises(ValueError, match="Published multi-GPU runs"):
        pages.with_published_table("# a page without the section\n", table)


def test_residual_points_and_coverage_bars() -> None:
    rep = _report()
    points = plots.residual_points(rep.gpu, pages.LEARNED)
    assert [(p.group, p.model, round(p.error_pct, 6)) for p in points] == [
        ("Tesla T4", "bert", 10.0), ("Tesla T4", "gpt2", -50.0),
        ("Tesla V100-PCIE-32GB", "bert", 20.0)]
    bars = plots.coverage_bars(rep)
    assert bars["shipped models"] == {"Tesla T4": (50.0, 2), "Tesla V100-PCIE-32GB": (100.0, 1)}
    assert bars["GPU left out of training"] == {"Tesla T4": (0.0, 1)}
    assert bars["CPU closed loop"] == {"CPU inference": (100.0, 1), "CPU train": (0.0, 1)}


@pytest.mark.slow  # matplotlib's import and two renders take seconds on the shared 2-core host
def test_eval_from_json_renders_the_shipped_results_without_measuring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    saved = report.from_json(json.loads(SHIPPED_JSON.read_text(encoding="utf-8")))
    assert cli_main.main(["eval", "--from-json", str(SHIPPED_JSON), "--out-dir",
                          str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "%|" not in out.err and "it/s" not in out.err  # stderr is not a TTY: no bars
    page = (tmp_path / "accuracy.md").read_text(encoding="utf-8")
    assert page.startswith("# How accurate are gpuplan's estimates?")
    assert str(paths.REPO_ROOT) not in page and "load average" not in page
    assert "Page rendered" in page and "gpuplan eval --from-json docs/accuracy.json" in page
    again = publishing.read(tmp_path / "accuracy.json")
    assert again.rendered is not None and again.measured == saved.measured
    assert (again.gpu, again.logo, again.cpu) == (saved.gpu, saved.logo, saved.cpu)
    for name in (pages.RESIDUALS_PNG, pages.COVERAGE_PNG):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"


def test_shipped_json_summaries_match_its_rows() -> None:
    """docs/accuracy.json's stored summaries are what its rows give (nothing edited by hand)."""
    doc = json.loads(SHIPPED_JSON.read_text(encoding="utf-8"))
    again = report.to_json(report.from_json(doc))
    for part in ("gpu_labels", "leave_one_gpu_out", "cpu_closed_loop"):
        assert again[part]["summary"] == doc[part]["summary"]
