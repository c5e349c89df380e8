"""Helpers behind the pytest fixtures of `tests/conftest.py` (importable by tests for type hints).

    from testbed_pytest import Kubectl, Testbed, wait_for

pytest's `pythonpath` (pyproject.toml) puts `testbed/` on `sys.path`, so test modules can
import this directly.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from testbed_procs import log_tail

T = TypeVar("T")
KUBECTL_TIMEOUT_S = 60.0


class WaitTimeout(AssertionError):
    """`wait_for` gave up; the message names what was awaited and the last value seen."""


def wait_for(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll `predicate` until it returns a truthy value, and return that value.

    Exceptions from the predicate count as "not yet" (the API may be briefly unavailable) but the
    last one is reported if time runs out.
    """
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"timed out after {timeout:.1f} s waiting for {what}; "
                              f"last value: {last!r}")
        time.sleep(interval)


def is_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


@dataclass(frozen=True)
class Testbed:
    """A running cluster for tests: the local testbed, or an external one (kind) when `external`."""

    __test__ = False

    kubeconfig: pathlib.Path
    kubectl_path: pathlib.Path
    helm_path: pathlib.Path | None
    extender_port: int | None
    extender_url: str | None
    gpuplan_scheduler_name: str
    state: dict[str, Any]
    external: bool

    @property
    def logs_dir(self) -> pathlib.Path | None:
        return None if self.external else pathlib.Path(self.state["logs_dir"])

    def log_tail(self, component: str, lines: int = 40) -> str:
        """Last lines of a component's log (e.g. "gpuplan-scheduler"), for assertion messages."""
        if self.logs_dir is None:
            return "(external cluster: no local logs)"
        return log_tail(self.logs_dir / f"{component}.log", lines)


class Kubectl:
    """The testbed's kubectl binary bound to its kubeconfig.

    `kubectl("get", "nodes")` returns the CompletedProcess (text) and raises `AssertionError` with
    stderr on a non-zero exit unless `check=False`; `kubectl.json("get", "pods", "-n", ns)` parses
    `-o json`.
    """

    def __init__(self, binary: pathlib.Path, kubeconfig: pathlib.Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(self, *args: str, input: str | None = None, check: bool = True,
                 timeout: float = KUBECTL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}:\n"
                                 f"{proc.stderr.strip()}")
        return proc

    def json(self, *args: str, timeout: float = KUBECTL_TIMEOUT_S) -> Any:
        return json.loads(self(*args, "-o", "json", timeout=timeout).stdout)


def namespace_name(test_name: str) -> str:
    """A fresh, valid namespace name derived from the test's name (≤ 63 chars)."""
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:45].strip("-") or "test"
    return f"t-{base}-{uuid.uuid4().hex[:6]}"
