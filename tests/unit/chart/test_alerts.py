"""The chart's alert rules as the PrometheusRule renders them: checked and unit-tested by the real
promtool, keyed on target labels rather than release names, each with a runbook section."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
from typing import Any

import yaml

from gpuplan_testing.helm_render import CHART, ROOT, helm
from gpuplan_testing.promql import (
    KUBE_SCHEDULER_SERIES,
    PROMETHEUS_SERIES,
    SOURCES,
    exposed_metric_names,
    metric_names,
    promtool,
)

# Not containing "gpuplan": the chart's names become "ml-platform-gpuplan-…", and job labels
# Prometheus derives from them would never be "gpuplan-estimator".
RELEASE = "ml-platform"
RUNBOOKS = ROOT / "docs" / "runbooks.md"
DEFAULT_RUNBOOK_BASE = "https://github.com/gpuplan/gpuplan/blob/main/docs/runbooks.md"
UNIT_TESTS = CHART / "tests" / "alerts_test.yaml"


def render(*sets: str, release: str = RELEASE) -> list[dict[str, Any]]:
    """Every object `helm template` renders with the PrometheusRule and ServiceMonitor on."""
    args = [helm(), "template", release, str(CHART), "--kube-version", "1.34.4", "-n", "ml",
            "--set", "metrics.prometheusRule.enabled=true",
            "--set", "metrics.serviceMonitor.enabled=true"]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def rule_groups(*sets: str, release: str = RELEASE) -> list[dict[str, Any]]:
    """The rendered PrometheusRule's groups."""
    (rule,) = [d for d in render(*sets, release=release) if d["kind"] == "PrometheusRule"]
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Alerting rules by name."""
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def write_rules(tmp_path: pathlib.Path, groups: list[dict[str, Any]]) -> pathlib.Path:
    """The groups as a Prometheus rule file, beside a copy of the promtool unit tests."""
    rules = tmp_path / "rendered-alerts.yaml"
    rules.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return rules


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown text (lower case, punctuation but
    hyphens dropped, spaces as hyphens)."""
    headings = re.findall(r"^#{1,6} +(.+?) *$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}


def test_rendered_rules_are_valid(tmp_path: pathlib.Path) -> None:
    rules = write_rules(tmp_path, rule_groups())
    out = subprocess.run([promtool(), "check", "rules", str(rules)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_rendered_rules_fire_as_specified(tmp_path: pathlib.Path) -> None:
    write_rules(tmp_path, rule_groups())
    out = subprocess.run([promtool(), "test", "rules", UNIT_TESTS.name], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_and_a_quiet_promtool_case() -> None:
    spec = yaml.safe_load(UNIT_TESTS.read_text())
    assert spec["rule_files"] == ["rendered-alerts.yaml"]
    firing: set[str] = set()
    quiet: set[str] = set()
    for case in spec["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = set(alerts(rule_groups()))
    assert names - firing == set(), "alerts without a case where they fire"
    assert names - quiet == set(), "alerts without a case where they stay quiet (exp_alerts: [])"
    assert (firing | quiet) - names == set(), "cases for alerts that do not exist"


def test_alerts_do_not_depend_on_the_release_name() -> None:
    """The same rules for any release name, selecting targets by the labels the ServiceMonitor
    copies from the Services, never by job name."""
    groups = rule_groups()
    assert rule_groups(release="gpuplan") == groups
    exprs = [r["expr"] for g in groups for r in g["rules"]]
    assert not [e for e in exprs if RELEASE in e or re.search(r"\bjob\s*=", e)]
    ups = [e for e in exprs if "up{" in e]
    assert len(ups) == 3
    components = {c for e in ups for c in re.findall(r'app_kubernetes_io_component="(\w+)"', e)}
    assert components == {"estimator", "operator", "extender"}
    assert all('app_kubernetes_io_name="gpuplan"' in e for e in ups)


def test_the_labels_alerts_select_on_are_on_every_scraped_service() -> None:
    """What the alerts' up{} selectors need: a Service per component carrying the labels the
    ServiceMonitor relabels into exactly the label names the expressions use."""
    docs = render()
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    for endpoint in monitor["spec"]["endpoints"]:
        relabeled = {r["targetLabel"]: r["sourceLabels"] for r in endpoint["relabelings"]}
        for key in ("name", "instance", "component"):
            assert relabeled[f"app_kubernetes_io_{key}"] == [
                f"__meta_kubernetes_service_label_app_kubernetes_io_{key}"]
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    selected = [d for d in docs if d["kind"] == "Service"
                and d["metadata"]["labels"].get("app.kubernetes.io/component")
                in monitor["spec"]["selector"]["matchExpressions"][0]["values"]]
    by_component = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s for s in selected}
    assert set(by_component) == {"estimator", "operator", "extender", "scheduler"}
    for component, service in by_component.items():
        labels = service["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "gpuplan"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert {p["name"] for p in service["spec"]["ports"]} & ports, component


def test_the_extender_alert_exists_only_with_the_extender() -> None:
    scheduler_only = {"GpuplanExtenderDown", "GpuplanSchedulerPodsPending"}
    assert scheduler_only <= set(alerts(rule_groups()))
    without = alerts(rule_groups("scheduler.enabled=false"))
    assert not scheduler_only & set(without) and "GpuplanOperatorDown" in without


def test_every_alert_links_its_section_of_the_runbooks() -> None:
    anchors = github_anchors(RUNBOOKS.read_text())
    rendered = alerts(rule_groups())
    assert len(rendered) >= 12
    for name, rule in rendered.items():
        url = rule["annotations"]["runbook_url"]
        base, _, anchor = url.partition("#")
        assert base == DEFAULT_RUNBOOK_BASE, name
        assert anchor == name.lower() and anchor in anchors, f"{name}: no section #{anchor}"
        # The section explains it: meaning, impact, diagnosis and fix.
        section = RUNBOOKS.read_text().split(f"## {name}\n", 1)[1].split("\n## ", 1)[0]
        for part in ("**Meaning.**", "**Impact.**", "**Diagnosis.**", "**Fix.**"):
            assert part in section, f"{name}: runbook lacks {part}"


def test_the_runbook_base_url_is_a_value() -> None:
    base = "https://git.example.com/platform/gpuplan/-/blob/v1/docs/runbooks.md"
    urls = {r["annotations"]["runbook_url"]
            for r in alerts(rule_groups(f"metrics.runbookBaseUrl={base}")).values()}
    assert urls and all(u.startswith(base + "#") for u in urls)


def test_rule_and_monitor_carry_the_labels_prometheus_selects_on() -> None:
    docs = render("metrics.serviceMonitor.labels.release=kube-prometheus-stack",
                  "metrics.prometheusRule.labels.release=kps-rules")
    kinds = {d["kind"]: d["metadata"]["labels"] for d in docs
             if d["kind"] in ("ServiceMonitor", "PrometheusRule")}
    assert kinds["ServiceMonitor"]["release"] == "kube-prometheus-stack"
    assert kinds["PrometheusRule"]["release"] == "kps-rules"
    assert kinds["ServiceMonitor"]["app.kubernetes.io/name"] == "gpuplan"


def test_every_rule_reads_metrics_the_code_defines() -> None:
    """A renamed metric must not leave an alert that can never fire (or always fires)."""
    groups = rule_groups()
    recorded = {r["record"] for g in groups for r in g["rules"] if "record" in r}
    defined = exposed_metric_names(SOURCES) | PROMETHEUS_SERIES | KUBE_SCHEDULER_SERIES | recorded
    for group in groups:
        for rule in group["rules"]:
            unknown = metric_names(rule["expr"]) - defined
            assert not unknown, f"{rule.get('alert') or rule['record']} reads {unknown}"


def test_the_extender_metrics_service_reaches_the_extenders_metrics_listener() -> None:
    """The Service scraped for GpuplanExtenderDown must land on the port the extender's
    --metrics-port opens (its filter/prioritize port stays on loopback, out of reach)."""
    docs = render("scheduler.extender.metricsPort=9555")
    (service,) = [d for d in docs if d["kind"] == "Service"
                  and d["metadata"]["labels"].get("app.kubernetes.io/component") == "extender"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"
                     and d["metadata"]["labels"].get("app.kubernetes.io/component") == "scheduler"]
    pod = deployment["spec"]["template"]
    assert all(pod["metadata"]["labels"].get(k) == v
               for k, v in service["spec"]["selector"].items())
    (extender,) = [c for c in pod["spec"]["containers"] if c["name"] == "extender"]
    args = extender["args"]
    assert args[args.index("--metrics-port") + 1] == "9555"
    assert args[args.index("--host") + 1] == "127.0.0.1"
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("metrics", 9555, 9555)
    assert {"name": "metrics", "containerPort": 9555} in extender["ports"]


def test_kube_scheduler_metrics_are_scraped_over_https_with_a_reader_role() -> None:
    """gpuplan-scheduler's kube-scheduler is watched (#32 item 7): a Service on its HTTPS port
    that the ServiceMonitor scrapes with a token, and a ClusterRole allowing `get` on /metrics
    (kube-scheduler authorizes each scrape), bound to the named scraper."""
    docs = render("metrics.schedulerMetricsReader.name=prometheus-k8s",
                  "metrics.schedulerMetricsReader.namespace=monitoring")
    (service,) = [d for d in docs if d["kind"] == "Service"
                  and d["metadata"]["labels"].get("app.kubernetes.io/component") == "scheduler"]
    (deployment,) = [d for d in docs if d["kind"] == "Deployment"
                     and d["metadata"]["labels"].get("app.kubernetes.io/component") == "scheduler"]
    pod = deployment["spec"]["template"]
    assert all(pod["metadata"]["labels"].get(k) == v
               for k, v in service["spec"]["selector"].items())
    (scheduler,) = [c for c in pod["spec"]["containers"] if c["name"] == "kube-scheduler"]
    (port,) = service["spec"]["ports"]
    assert {"name": port["targetPort"], "containerPort": port["port"]} in scheduler["ports"]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    [endpoint] = [e for e in monitor["spec"]["endpoints"] if e["port"] == port["name"]]
    assert endpoint["scheme"] == "https" and endpoint["path"] == "/metrics"
    assert endpoint["bearerTokenFile"].endswith("serviceaccount/token")
    name = f"{RELEASE}-gpuplan-scheduler-metrics-reader"
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == name]
    assert role["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    (binding,) = [d for d in docs if d["kind"] == "ClusterRoleBinding"
                  and d["metadata"]["name"] == name]
    assert binding["roleRef"]["name"] == name
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "prometheus-k8s",
                                    "namespace": "monitoring"}]
    unbound = render()
    assert not [d for d in unbound if d["kind"] == "ClusterRoleBinding"
                and d["metadata"]["name"] == name]
    assert not [d for d in render("scheduler.enabled=false")
                if d["metadata"]["name"].startswith(f"{RELEASE}-gpuplan-scheduler")]
