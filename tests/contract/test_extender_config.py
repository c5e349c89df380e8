"""deploy/scheduler/gpuplan-scheduler-config.yaml: the documented choices, validated by the real
kube-scheduler (`--write-config-to` loads, defaults and validates the file, then exits)."""

from __future__ import annotations

import pathlib
import subprocess
from typing import Any

import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "deploy" / "scheduler" / "gpuplan-scheduler-config.yaml"


def rendered(tmp_path: pathlib.Path, **overrides: Any) -> dict[str, Any]:
    text = TEMPLATE.read_text().replace("KUBECONFIG_PATH", str(tmp_path / "kubeconfig"))
    doc: dict[str, Any] = yaml.safe_load(text.replace("EXTENDER_URL", "http://127.0.0.1:8888/x"))
    doc["extenders"][0].update(overrides)
    return doc


def test_template_choices(tmp_path: pathlib.Path) -> None:
    doc = rendered(tmp_path)
    assert doc["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert [p["schedulerName"] for p in doc["profiles"]] == ["gpuplan-scheduler"]
    (ext,) = doc["extenders"]
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert ext["httpTimeout"] == "2s"
    assert ext["managedResources"] == [{"name": "nvidia.com/gpu", "ignoredByScheduler": False}]
    assert (ext["filterVerb"], ext["prioritizeVerb"]) == ("filter", "prioritize")
    assert "bindVerb" not in ext


def kube_scheduler() -> pathlib.Path:
    import gpuplan_testbed  # on sys.path via pytest's `pythonpath`

    binary = pathlib.Path(gpuplan_testbed.default_bin_dir()) / "kube-scheduler"
    if not binary.exists():
        pytest.skip(f"{binary} not built (make testbed-build)")
    return binary


def validate(tmp_path: pathlib.Path, doc: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "kubeconfig").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
        "users": [{"name": "x", "user": {}}]}))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(doc))
    return subprocess.run([str(kube_scheduler()), f"--config={config}",
                           f"--write-config-to={tmp_path / 'out.yaml'}"],
                          capture_output=True, text=True, timeout=60)


def test_real_kube_scheduler_accepts_the_template(tmp_path: pathlib.Path) -> None:
    proc = validate(tmp_path, rendered(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (ext,) = yaml.safe_load((tmp_path / "out.yaml").read_text())["extenders"]
    assert ext["nodeCacheCapable"] is True and ext["httpTimeout"] == "2s"


def test_real_kube_scheduler_rejects_a_broken_extender(tmp_path: pathlib.Path) -> None:
    proc = validate(tmp_path, rendered(tmp_path, weight=0))  # prioritizeVerb needs weight > 0
    assert proc.returncode != 0
    assert "weight" in proc.stderr
