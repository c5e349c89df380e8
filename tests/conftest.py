"""Fixtures shared by all tests; those needing a cluster start the local testbed lazily.

Cluster fixtures (see docs/testbed.md):

* `testbed` (session): a `testbed_pytest.Testbed` for the running control plane. Brings the local
  testbed up, or reuses a healthy one (`make testbed-up`). Concurrent pytest sessions share it
  (flock + user records in the state dir); the last one out stops it unless a person started it
  with `make testbed-up` or `GPUPLAN_TESTBED_KEEP=1` is set. Sets `KUBECONFIG` for the session, so
  kopf's `KopfRunner` and the kubernetes client find the cluster. Skips when the binaries are
  absent (run `make testbed-build`), but fails under `CI=true`. With `GPUPLAN_KUBECONFIG` set it
  uses that cluster instead (kind, `make kind-e2e`) and starts nothing.
* `api_client` (session): `kubernetes.client.ApiClient` for that kubeconfig; `core_v1`, `batch_v1`.
* `kubectl` (session): `testbed_pytest.Kubectl`, the built kubectl bound to the kubeconfig.
* `namespace` (per test): a fresh namespace name, deleted after the test.
* `wait_for` : `wait_for(predicate, timeout, what)` → the predicate's truthy value, or a clear
  `AssertionError` naming `what`.

Only tests that request these fixtures pay for the testbed; unit tests never start it.
"""

from __future__ import annotations

import os
import pathlib
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

import testbed_pytest  # noqa: E402
from testbed_common import Layout  # noqa: E402
from testbed_lock import add_user, exclusive, remove_user  # noqa: E402
from testbed_pytest import Kubectl, Testbed  # noqa: E402

_HTTP_TIMEOUT_S = 30


def _require(condition: bool, message: str) -> None:
    """Skip locally, fail in CI: CI builds the binaries first, so their absence there is a bug."""
    if condition:
        return
    if testbed_pytest.is_ci():
        pytest.fail(f"{message} (CI=true: missing testbed parts are an error)", pytrace=False)
    pytest.skip(message)


def _external_testbed(kubeconfig: pathlib.Path) -> Testbed:
    kubectl = shutil.which("kubectl")
    _require(kubectl is not None, "GPUPLAN_KUBECONFIG is set but no kubectl on PATH")
    helm = shutil.which("helm")
    port = os.environ.get("GPUPLAN_EXTENDER_PORT")
    return Testbed(
        kubeconfig=kubeconfig, kubectl_path=pathlib.Path(str(kubectl)),
        helm_path=pathlib.Path(helm) if helm else None,
        extender_port=int(port) if port else None,
        extender_url=f"http://127.0.0.1:{port}/extender" if port else None,
        gpuplan_scheduler_name="gpuplan-scheduler", state={}, external=True,
    )


@pytest.fixture(scope="session")
def testbed() -> Iterator[Testbed]:
    external = os.environ.get("GPUPLAN_KUBECONFIG")
    with pytest.MonkeyPatch.context() as mp:
        if external:
            tb = _external_testbed(pathlib.Path(external).resolve())
            mp.setenv("KUBECONFIG", str(tb.kubeconfig))
            yield tb
            return
        import gpuplan_testbed as runner

        bin_dir = runner.default_bin_dir()
        missing = runner.missing_binaries(bin_dir)
        _require(not missing, f"testbed binaries missing in {bin_dir}: {missing}; "
                              "run `make testbed-build`")
        settings = runner.Settings(bin_dir=bin_dir)
        layout = Layout(settings.state_dir)
        with exclusive(layout):  # other pytest sessions may share this working tree
            state = runner.up(settings, owner="pytest")
            add_user(layout)
        helm = pathlib.Path(state["helm"])
        tb = Testbed(
            kubeconfig=pathlib.Path(state["kubeconfig"]),
            kubectl_path=pathlib.Path(state["kubectl"]),
            helm_path=helm if os.access(helm, os.X_OK) else None,
            extender_port=state["extender_port"], extender_url=state["extender_url"],
            gpuplan_scheduler_name=state["gpuplan_scheduler_name"], state=state, external=False,
        )
        mp.setenv("KUBECONFIG", str(tb.kubeconfig))
        try:
            yield tb
        finally:
            with exclusive(layout):
                others = remove_user(layout)
                current = runner.load_state(layout)
                # The last pytest user stops a pytest-started testbed; `make testbed-up` keeps it.
                if (others == 0 and current is not None and current.get("owner") == "pytest"
                        and not os.environ.get("GPUPLAN_TESTBED_KEEP")):
                    runner.down(layout)


@pytest.fixture(scope="session")
def api_client(testbed: Testbed) -> Iterator[Any]:
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(testbed.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def core_v1(api_client: Any) -> Any:
    from kubernetes import client

    return client.CoreV1Api(api_client)


@pytest.fixture(scope="session")
def batch_v1(api_client: Any) -> Any:
    from kubernetes import client

    return client.BatchV1Api(api_client)


@pytest.fixture(scope="session")
def kubectl(testbed: Testbed) -> Kubectl:
    return Kubectl(testbed.kubectl_path, testbed.kubeconfig)


@pytest.fixture
def namespace(request: pytest.FixtureRequest, core_v1: Any) -> Iterator[str]:
    """A fresh namespace for one test; deleted afterwards without waiting (kcm empties it)."""
    from kubernetes.client.exceptions import ApiException

    name = testbed_pytest.namespace_name(request.node.name)
    body = {"metadata": {"name": name, "labels": {"gpuplan.io/test": "true"}}}
    core_v1.create_namespace(body=body, _request_timeout=_HTTP_TIMEOUT_S)
    try:
        yield name
    finally:
        try:
            core_v1.delete_namespace(name, _request_timeout=_HTTP_TIMEOUT_S)
        except ApiException as exc:
            if exc.status != 404:
                raise


@pytest.fixture
def wait_for() -> Callable[..., Any]:
    return testbed_pytest.wait_for
