"""Writes the accuracy report's files: ``accuracy.md``, ``accuracy.json`` and its pictures."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from gpuplan_estimator.evaluation import pages, plots, report
from gpuplan_estimator.evaluation.report import Report

MARKDOWN = "accuracy.md"
JSON = "accuracy.json"


def write(rep: Report, out_dir: Path, *, roots: Mapping[str, str]) -> tuple[Path, ...]:
    """Write the page, the JSON and both pictures into `out_dir`; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    md, js = out_dir / MARKDOWN, out_dir / JSON
    residuals, coverage = out_dir / pages.RESIDUALS_PNG, out_dir / pages.COVERAGE_PNG
    plots.plot_residuals(rep, residuals)
    plots.plot_coverage(rep, coverage)
    js.write_text(json.dumps(report.to_json(rep), indent=1) + "\n", encoding="utf-8")
    # the published-run table comes from its own command (evaluation.published_runs): kept
    kept = pages.published_table_of(md.read_text(encoding="utf-8")) if md.exists() else None
    md.write_text(pages.to_markdown(rep, roots=roots, json_name=js.name,
                                    residuals_png=residuals.name, coverage_png=coverage.name,
                                    published_table=kept),
                  encoding="utf-8")
    return md, js, residuals, coverage


def read(path: Path) -> Report:
    """The report saved at `path` by `write` (for re-rendering without measuring)."""
    return report.from_json(json.loads(path.read_text(encoding="utf-8")))
