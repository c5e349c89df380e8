"""Kueue on the testbed: its CRDs and its real controller manager, built by
hack/testbed-build.sh (docs/kueue.md), run as a local process against the testbed apiserver.

Kueue runs without webhooks and without its internal cert management: the webhook server
listens on loopback with a throw-away certificate, but no webhook configuration points at it,
so the apiserver never calls it (the operator creates its Jobs suspended itself). Only the
batch/job integration is on and only labelled Jobs are managed, so the other tests sharing the
testbed never meet Kueue.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from gpuplan_testing.helm_render import ROOT

NAMESPACE = "kueue-system"
"""Kueue's own namespace: its leader-election Lease lives there."""
READY_TIMEOUT_S = 60.0


def bin_dir() -> pathlib.Path:
    """The testbed's bin directory, where the build puts `kueue` and `kueue-crds/`."""
    out = subprocess.run(["bash", str(ROOT / "hack" / "testbed-build.sh"), "--print-bin"],
                         capture_output=True, text=True, check=True, timeout=30)
    return pathlib.Path(out.stdout.strip())


def require_kueue() -> tuple[pathlib.Path, pathlib.Path]:
    """(kueue binary, CRD directory); skipped when not built, failed in CI (which builds it)."""
    binary, crds = bin_dir() / "kueue", bin_dir() / "kueue-crds"
    if not binary.exists() or not crds.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail("kueue missing: .ci/run builds it with hack/testbed-build.sh")
        pytest.skip("kueue not built (make testbed-build)")
    return binary, crds


def install_crds(kubectl: Any, crds: pathlib.Path) -> None:
    """Kueue's CRDs, server-side (the Workload CRD is too large for client-side apply)."""
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crds))
    kubectl("wait", "--for=condition=Established", "--timeout=60s",
            *(f"crd/{p.name.removeprefix('kueue.x-k8s.io_').removesuffix('.yaml')}"
              f".kueue.x-k8s.io" for p in sorted(crds.glob("*.yaml"))))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _self_signed(cert_dir: pathlib.Path) -> None:
    """tls.crt/tls.key for the webhook and metrics servers (never called by anyone)."""
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", str(cert_dir / "tls.key"),
                    "-out", str(cert_dir / "tls.crt")], check=True, capture_output=True,
                   timeout=60)


def configuration(cert_dir: pathlib.Path, health_port: int, webhook_port: int) -> dict[str, Any]:
    """Kueue's Configuration for the testbed: loopback listeners, batch/job only."""
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        # Several pytest sessions may share one testbed: one Kueue leads, the others wait.
        "leaderElection": {"leaderElect": True, "resourceName": "gpuplan-testbed-kueue",
                           "resourceNamespace": NAMESPACE},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        # What docs/kueue.md recommends for multi-node plans: a workload whose pods are not all
        # Ready in time is evicted and requeued, releasing what the others held.
        "waitForPodsReady": {"timeout": "5m", "blockAdmission": False},
        "integrations": {"frameworks": ["batch/job"]},
    }


@contextlib.contextmanager
def run_kueue(binary: pathlib.Path, kubeconfig: pathlib.Path, kubectl: Any,
              log_dir: pathlib.Path) -> Iterator[pathlib.Path]:
    """Kueue's controller manager until the block ends; yields its log file."""
    kubectl("create", "namespace", NAMESPACE, check=False)
    with tempfile.TemporaryDirectory(prefix="kueue-") as tmp:
        work = pathlib.Path(tmp)
        _self_signed(work)
        health = _free_port()
        config = work / "config.yaml"
        config.write_text(yaml.safe_dump(configuration(work, health, _free_port())))
        log = log_dir / "kueue.log"
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "KUEUE_METRICS_CERT_DIR": str(work)}
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [str(binary), f"--config={config}", "--feature-gates=VisibilityOnDemand=false",
                 "--zap-log-level=2"], stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            _wait_ready(proc, f"http://127.0.0.1:{health}/readyz", log)
            yield log
        finally:
            proc.terminate()
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: pathlib.Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"kueue exited with {proc.returncode}:\n{tail(log)}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=2) as resp:
            if resp.status == 200:
                return
        time.sleep(0.3)
    raise AssertionError(f"kueue not ready after {READY_TIMEOUT_S:.0f} s:\n{tail(log)}")


def tail(log: pathlib.Path, lines: int = 40) -> str:
    """The last lines of Kueue's log, for assertion messages."""
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
