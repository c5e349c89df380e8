"""The Grafana dashboard ConfigMap: sidecar label, the panels the issue asks for, and queries that
read only metrics the code defines, in PromQL that promtool accepts."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
from typing import Any

import yaml

from gpuplan_testing.helm_render import CHART, helm
from gpuplan_testing.promql import (
    PROMETHEUS_SERIES,
    SOURCES,
    exposed_metric_names,
    metric_names,
    promtool,
)


def render(*sets: str) -> list[dict[str, Any]]:
    """The chart rendered with the dashboard on (release name without "gpuplan")."""
    args = [helm(), "template", "ml-platform", str(CHART), "--kube-version", "1.34.4",
            "--set", "metrics.grafanaDashboard.enabled=true"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def dashboard_configmap(*sets: str) -> dict[str, Any]:
    """The rendered dashboard ConfigMap."""
    (cm,) = [d for d in render(*sets)
             if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    return cm


def dashboard() -> dict[str, Any]:
    """The dashboard as the ConfigMap carries it."""
    data: dict[str, Any] = json.loads(dashboard_configmap()["data"]["gpuplan.json"])
    return data


def panel_queries(board: dict[str, Any]) -> dict[str, list[str]]:
    """PromQL of every panel's targets, by panel title."""
    return {p["title"]: [t["expr"] for t in p.get("targets", [])]
            for p in board["panels"] if p["type"] != "row"}


def test_metric_names_are_read_from_promql() -> None:
    """The extractor itself: it must see every metric and nothing else."""
    expr = ('exp(sum by (gpu_type) (rate(a_total{x="y",le="0.5"}[6h])) - on (g) b_bucket'
            ' / ignoring(le) max(c) and d) > bool 1.5e3 or up{j=~"gpuplan_x"}[$__rate_interval]')
    assert metric_names(expr) == {"a_total", "b_bucket", "c", "d", "up"}


def test_configmap_carries_the_sidecar_label_from_values() -> None:
    cm = dashboard_configmap()
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    cm = dashboard_configmap("metrics.grafanaDashboard.labels.grafana_dashboard=null",
                             "metrics.grafanaDashboard.labels.team-dashboards=gpu",
                             "metrics.grafanaDashboard.annotations.grafana_folder=GPU")
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    assert cm["metadata"]["labels"]["team-dashboards"] == "gpu"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    off = [d for d in render("metrics.grafanaDashboard.enabled=false")
           if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert off == []


def test_dashboard_shows_what_the_issue_asks_for() -> None:
    queries = panel_queries(dashboard())
    joined = {title: " ".join(exprs) for title, exprs in queries.items()}

    def panel_reading(*metrics: str) -> list[str]:
        return [t for t, q in joined.items() if all(m in q for m in metrics)]

    assert panel_reading("gpuplan_estimate_seconds", "gpuplan_actual_seconds")  # estimate vs actual
    drift = panel_reading("gpuplan_drift_log_slow_total", "gpuplan_drift_ratio_count")
    assert drift and all("by (gpu_type)" in joined[t] for t in drift)  # drift by GPU type
    assert panel_reading('gpuplan_estimator_request_seconds_bucket{endpoint="/v1/plans"}')
    assert panel_reading("gpuplan_extender_request_duration_seconds_bucket")
    assert panel_reading("gpuplan_gpu_type_measurements", "gpuplan_benchmark_age_seconds")
    assert all(exprs for exprs in queries.values()), "a panel without a query"


def test_every_query_reads_metrics_the_code_defines() -> None:
    defined = exposed_metric_names(SOURCES) | PROMETHEUS_SERIES
    # The extender is part of the operator package; the estimator's plan histogram is there too.
    assert {"gpuplan_extender_request_duration_seconds_bucket",
            "gpuplan_estimator_request_seconds_bucket", "gpuplan_drift_log_slow_total",
            "gpuplan_estimator_requests_total"} <= defined
    for title, exprs in panel_queries(dashboard()).items():
        for expr in exprs:
            unknown = metric_names(expr) - defined
            assert not unknown, f"{title!r} reads {unknown}, which no metric definition exposes"


def test_every_query_is_valid_promql(tmp_path: pathlib.Path) -> None:
    """promtool parses each query as a recording rule (Grafana's interval variables become a
    fixed range first)."""
    rules = []
    for i, exprs in enumerate(panel_queries(dashboard()).values()):
        for j, expr in enumerate(exprs):
            rules.append({"record": f"dashboard:panel{i}:query{j}",
                          "expr": re.sub(r"\$__(rate_)?interval", "5m", expr)})
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    out = subprocess.run([promtool(), "check", "rules", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(rules)} rules found" in out.stdout


def test_dashboard_uses_a_datasource_variable() -> None:
    """A fixed datasource uid would not exist in the user's Grafana."""
    board = dashboard()
    (variable,) = [v for v in board["templating"]["list"] if v["type"] == "datasource"]
    uid = "${" + variable["name"] + "}"
    for panel in board["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert all(t["datasource"]["uid"] == uid for t in panel["targets"]), panel["title"]
