"""The plans report: one case planned and written as the page shows it."""

from __future__ import annotations

from gpuplan_estimator.evaluation import plans_report
from gpuplan_estimator.interfaces import json_documents
from gpuplan_testing.contexts import roofline_context


def test_a_case_is_planned_with_its_layout_strategy_and_memory() -> None:
    case = plans_report.PlanCase("tiny GPT-2", {**plans_report.GPT2_MEDIUM, "n_layer": 2}, batch=64,
                             sequence=512, tokens=64 * 512 * 100)
    doc = json_documents.planned_json(plans_report.plan_case(case, roofline_context()),
                                 max_candidates=None)
    chosen = doc["plan"]
    assert chosen["gpu_type"] in {t for t, _, _ in plans_report.POOLS}
    assert chosen["estimated_seconds"] <= plans_report.DEADLINE_SECONDS
    lines = plans_report.case_section(case, doc, 1.0)
    assert lines[0] == "## tiny GPT-2"
    assert f"**Plan: {chosen['gpu_count']} x {chosen['gpu_type']}**" in lines[2]
    assert chosen["strategy"]["label"] in lines[2]
    assert any(line.startswith("- memory per GPU") for line in lines)
    page = plans_report.page(lines, "make plans-report", "roofline")
    assert "make plans-report" in page and "## tiny GPT-2" in page
