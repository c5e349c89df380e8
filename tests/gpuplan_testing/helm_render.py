"""`helm template` of charts/gpuplan with the testbed-built helm (skip locally, fail in CI)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpuplan"


K8S_VERSION_VARIABLE = "GPUPLAN_K8S_VERSION"
"""Set, the testbed (and so its helm) is that Kubernetes version (`make testbed-compat`)."""


def _build_script(flag: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(["bash", str(ROOT / "hack" / "testbed-build.sh"), flag],
                         capture_output=True, text=True, check=True, timeout=30, env=env)
    return out.stdout.strip()


def default_kube_version() -> str:
    """The Kubernetes version the testbed builds unless told another, without the `v`."""
    env = {k: v for k, v in os.environ.items() if k != K8S_VERSION_VARIABLE}
    return _build_script("--print-k8s-version", env).removeprefix("v")


def built_kube_version() -> str:
    """The Kubernetes version of the testbed this run uses (hack/testbed-build.sh), no `v`."""
    return _build_script("--print-k8s-version").removeprefix("v")


def helm() -> str:
    path = pathlib.Path(_build_script("--print-bin")) / "helm"
    if not path.exists():
        if os.environ.get("CI") == "true":
            pytest.fail("helm missing: .ci/run builds it with hack/testbed-build.sh")
        pytest.skip("helm not built (make testbed-build)")
    return str(path)


def render(*sets: str, namespace: str = "default") -> subprocess.CompletedProcess[str]:
    args = [helm(), "template", "t", str(CHART), "--kube-version", built_kube_version(),
            "-n", namespace]
    for s in sets:
        args += ["--set", s]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)
