"""PromQL helpers for the chart's tests: which series the code's prometheus_client definitions
expose, and which metric names an expression reads."""

from __future__ import annotations

import os
import pathlib
import re
import shutil

import pytest

from gpuplan_testing.helm_render import ROOT


def promtool() -> str:
    """The promtool on PATH (skip locally without it, fail in CI)."""
    path = shutil.which("promtool")
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail("promtool missing: .ci/run installs Debian's prometheus package")
        pytest.skip("promtool not installed (apt-get install prometheus)")
    return path


SOURCES = [ROOT / "estimator" / "gpuplan_estimator", ROOT / "operator" / "gpuplan_operator"]
# prometheus_client definitions: Counter("name", …), Histogram(\n "name", …).
DEFINITION = re.compile(r"\b(Counter|Gauge|Histogram|Summary)\(\s*\"([a-zA-Z_:][a-zA-Z0-9_:]*)\"")
# Series every Prometheus has for each target, whatever the code defines.
PROMETHEUS_SERIES = {"up"}
# kube-scheduler's series the alerts read (gpuplan-scheduler runs a stock kube-scheduler):
# `scheduler_pending_pods{queue}`, STABLE, in k8s.io/kubernetes pkg/scheduler/metrics/metrics.go
# of v1.34.4 and v1.37.2 alike (read from the module cache, 2026-11-28);
# tests/integration/test_scheduler_metrics.py scrapes it from the testbed's kube-scheduler.
KUBE_SCHEDULER_SERIES = {"scheduler_pending_pods"}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and",
                "or", "unless", "offset", "inf", "nan"}


def exposed_metric_names(paths: list[pathlib.Path]) -> set[str]:
    """Series names the prometheus_client definitions under `paths` expose."""
    names: set[str] = set()
    for path in paths:
        for source in path.rglob("*.py"):
            for kind, name in DEFINITION.findall(source.read_text()):
                if kind == "Counter":
                    names.add(name.removesuffix("_total") + "_total")
                elif kind in ("Histogram", "Summary"):
                    names |= {name, f"{name}_sum", f"{name}_count"}
                    if kind == "Histogram":
                        names.add(f"{name}_bucket")
                else:
                    names.add(name)
    return names


def metric_names(expr: str) -> set[str]:
    """Metric names a PromQL expression reads: identifiers outside strings, label matchers,
    grouping clauses and ranges that are neither functions nor keywords."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", "", text)
    text = re.sub(r"\[[^\]]*\]", "", text)
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)
    text = re.sub(r"\$\{?\w+\}?", "", text)
    words = re.findall(r"(?<![\w.:])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:]|\s*\()", text)
    return {w for w in words if w.lower() not in PROMQL_WORDS}
