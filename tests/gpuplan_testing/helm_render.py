"""`helm template` of charts/gpuplan with the testbed-built helm (skip locally, fail in CI)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpuplan"


def helm() -> str:
    out = subprocess.run(["bash", str(ROOT / "hack" / "testbed-build.sh"), "--print-bin"],
                         capture_output=True, text=True, check=True, timeout=30)
    path = pathlib.Path(out.stdout.strip()) / "helm"
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("helm missing: .ci/run builds it with hack/testbed-build.sh")
        pytest.skip("helm not built (make testbed-build)")
    return str(path)


def render(*sets: str, namespace: str = "default") -> subprocess.CompletedProcess[str]:
    args = [helm(), "template", "t", str(CHART), "--kube-version", "1.34.4", "-n", namespace]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)
