"""NOTES.txt as helm renders it after an install: real commands naming objects the chart creates,
files that exist, and no placeholder URL."""

from __future__ import annotations

import pathlib
import re
import shlex
import shutil
import subprocess
from typing import Any

import yaml

from gpuplan_testing.helm_render import CHART, ROOT, helm

RELEASE = "ml-platform"
NAMESPACE = "ml"


def render(tmp_path: pathlib.Path, *sets: str) -> tuple[str, list[dict[str, Any]]]:
    """The rendered NOTES and manifests. `helm template` skips NOTES.txt and `helm install
    --dry-run` needs a cluster, so a copy of the chart renders the same text as a template."""
    chart = tmp_path / "gpuplan"
    shutil.copytree(CHART, chart)
    notes = (chart / "templates" / "NOTES.txt").read_text()
    (chart / "templates" / "_notes_under_test.tpl").write_text(
        '{{- define "notes.under.test" -}}' + notes + "{{- end -}}")
    (chart / "templates" / "notes-under-test.yaml").write_text(
        'kind: NotesUnderTest\ntext: {{ include "notes.under.test" . | toJson }}\n')
    args = [helm(), "template", RELEASE, str(chart), "--kube-version", "1.34.4", "-n", NAMESPACE]
    for s in sets:
        args += ["--set", s]
    out = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    (text,) = [d["text"] for d in docs if d["kind"] == "NotesUnderTest"]
    return text, [d for d in docs if d["kind"] != "NotesUnderTest"]


def commands(text: str) -> list[list[str]]:
    """The shell commands of the notes (indented lines starting with kubectl or curl, with
    backslash continuations joined and trailing comments dropped)."""
    joined = re.sub(r"\\\n\s*", "", text)
    lines = [line.split("  #")[0].strip() for line in joined.splitlines()]
    return [shlex.split(line) for line in lines if re.match(r"(kubectl|curl) ", line)]


def test_notes_have_no_placeholder(tmp_path: pathlib.Path) -> None:
    text, _ = render(tmp_path, "metrics.prometheusRule.enabled=true")
    assert "..." not in text and "example.com" not in text and "<" not in text
    assert set(re.findall(r"https?://\S+", text)) == {
        "https://github.com/gpuplan/gpuplan/blob/main/docs/runbooks.md"}


def test_notes_commands_name_what_the_chart_installs(tmp_path: pathlib.Path) -> None:
    text, docs = render(tmp_path)
    cmds = commands(text)
    verbs = [c[3] if c[0] == "kubectl" else "curl" for c in cmds]
    assert {"get", "rollout", "create", "apply", "describe", "port-forward", "curl"} <= set(verbs)
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    pods = [d["spec"]["template"]["metadata"]["labels"] for d in docs if d["kind"] == "Deployment"]
    for cmd in cmds:
        if cmd[0] != "kubectl":
            continue
        assert cmd[1:3] == ["-n", NAMESPACE] or cmd[1:3] == ["-n", "default"], cmd
        if "-l" in cmd:
            key, _, value = cmd[cmd.index("-l") + 1].partition("=")
            assert sum(labels.get(key) == value for labels in pods) == 3, cmd  # every component
        if cmd[3] == "rollout":
            assert ("Deployment", cmd[5].removeprefix("deploy/")) in names, cmd
        if cmd[3] == "apply":
            example = ROOT / cmd[cmd.index("-f") + 1]
            assert example.is_file(), cmd
            tj = yaml.safe_load(example.read_text())
            assert tj["kind"] == "TrainingJob"
            assert f"tj {tj['metadata']['name']}" in text
            assert f"configmap {tj['spec']['model']['onnx']['configMapKeyRef']['name']}" in text
        if cmd[3] == "port-forward":
            service = services[cmd[4].removeprefix("svc/")]
            local, _, remote = cmd[5].partition(":")
            assert int(remote) in {p["port"] for p in service["spec"]["ports"]}, cmd
            assert any(f"localhost:{local}/" in " ".join(c) for c in cmds if c[0] == "curl")


def test_notes_follow_the_values(tmp_path: pathlib.Path) -> None:
    text, _ = render(tmp_path, "operator.namespaces={team-a,team-b}", "scheduler.enabled=false",
                     "metrics.serviceMonitor.enabled=true",
                     "metrics.grafanaDashboard.enabled=true")
    assert "kubectl -n team-a apply -f docs/examples/" in text
    assert "team-a, team-b only" in text
    assert "schedulerName" not in text and "extender" not in text
    assert f"ServiceMonitor {RELEASE}-gpuplan scrapes the estimator and operator;" in text
    assert f"ConfigMap {RELEASE}-gpuplan-dashboard" in text
    assert "PrometheusRule" not in text
