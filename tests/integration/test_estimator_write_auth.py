"""`gpuplan serve --write-auth tokenreview` against the real testbed API server (issue #16).

The estimator runs as a process with the testbed's admin kubeconfig as its own identity (it may
create tokenreviews); callers are ServiceAccounts of the test's namespace with tokens minted by
the TokenRequest API. Only the allowed one moves the calibration; no token, a garbage token or
another account's token leave a T4 prediction where it was (the issue's hostile client).
"""

from __future__ import annotations

import base64
import os
import pathlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import requests

from gpuplan_testing import operator_harness as h
from gpuplan_testing.estimator_server import serve_process


def mint_token(core_v1: Any, namespace: str, name: str) -> str:
    """A ServiceAccount `name` in `namespace` and a 10-minute token for it (TokenRequest)."""
    core_v1.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
    answer = core_v1.create_namespaced_service_account_token(
        name, namespace, {"spec": {"expirationSeconds": 600}})
    return str(answer.status.token)


@contextmanager
def serve_guarded(testbed: Any, namespace: str, tmp_path: pathlib.Path,
                  *extra: str) -> Iterator[str]:
    """`gpuplan serve` with tokenreview writes for `<namespace>:writer` (and `extra` flags)."""
    port = h.free_port()
    argv = [str(pathlib.Path(sys.executable).with_name("gpuplan")), "serve", "--host",
            "127.0.0.1", "--port", str(port), "--db", f"sqlite:///{tmp_path / 'perf.db'}",
            "--bundle-poll", "3600", "--workers", "1",
            "--write-auth", "tokenreview", "--write-auth-kubeconfig", str(testbed.kubeconfig),
            "--write-allowed-subjects", f"system:serviceaccount:{namespace}:writer", *extra]
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    with serve_process(argv, port, tmp_path / "estimator.log", ready_timeout_s=180,
                       env=env) as url:
        yield url


@pytest.fixture
def guarded_estimator(testbed: Any, namespace: str, tmp_path: pathlib.Path) -> Iterator[str]:
    with serve_guarded(testbed, namespace, tmp_path) as url:
        yield url


def t4_step_ms(url: str) -> float:
    body = {"model_onnx_b64": _resnet_b64(),
            "training": {"batch_size": 8, "dataset_size": 800, "epochs": 1},
            "devices": ["Tesla T4"]}
    resp = requests.post(f"{url}/v1/estimate", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return float(resp.json()["devices"][0]["calibrated_step_time_ms"])


def _resnet_b64() -> str:
    return base64.b64encode(h.RESNET50.read_bytes()).decode()


def post_outcome(url: str, uid: str, token: str | None) -> requests.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    body = {"job_uid": uid, "gpu_type": "Tesla T4", "gpu_count": 1, "estimated_seconds": 100.0,
            "actual_seconds": 340.0, "calibration_factor": 1.0}
    return requests.post(f"{url}/v1/outcomes", json=body, headers=headers, timeout=30)


def assert_status(resp: requests.Response, expected: int, tmp_path: pathlib.Path) -> None:
    """`resp` has status `expected`; else the estimator's log tail says why (a 503's cause, the
    API server's answer or the timeout, is only in its log)."""
    if resp.status_code != expected:
        log = (tmp_path / "estimator.log").read_text(errors="replace").splitlines()[-20:]
        raise AssertionError(f"{resp.status_code} != {expected}: {resp.text}\n"
                             "estimator log:\n" + "\n".join(log))


def test_only_the_allowed_service_account_moves_the_calibration(
        guarded_estimator: str, core_v1: Any, namespace: str) -> None:
    url = guarded_estimator
    writer = mint_token(core_v1, namespace, "writer")
    other = mint_token(core_v1, namespace, "other")
    before = t4_step_ms(url)

    # The hostile client of the issue: three unauthenticated posts.
    for i in range(3):
        resp = post_outcome(url, f"hostile-{i}", None)
        assert resp.status_code == 401, resp.text
        assert resp.json()["error"]["reason"] == "Unauthenticated"
    assert t4_step_ms(url) == before

    resp = post_outcome(url, "garbage", "garbage." + writer[8:40])
    assert resp.status_code == 401, resp.text
    resp = post_outcome(url, "other", other)
    assert resp.status_code == 403, resp.text
    assert f"system:serviceaccount:{namespace}:other" in resp.json()["error"]["message"]
    assert t4_step_ms(url) == before

    resp = post_outcome(url, "allowed", writer)
    assert resp.status_code == 201, resp.text
    assert resp.json()["duplicate"] is False
    assert t4_step_ms(url) > before  # the operator's outcome does calibrate
    # Reads need no token.
    assert requests.get(f"{url}/v1/models", timeout=30).status_code == 200


@pytest.fixture
def audience_estimator(testbed: Any, namespace: str, tmp_path: pathlib.Path) -> Iterator[str]:
    """As the chart runs it (issue #33): only tokens minted for `gpuplan-estimator` count."""
    with serve_guarded(testbed, namespace, tmp_path, "--write-auth-audiences",
                       "gpuplan-estimator") as url:
        yield url


def test_a_token_for_the_api_server_is_refused_even_from_the_allowed_account(
        audience_estimator: str, core_v1: Any, namespace: str, tmp_path: pathlib.Path) -> None:
    """The allowed account's ordinary token (what a pod's environment or mount holds) replays
    nowhere: only one minted for the estimator's audience writes."""
    url = audience_estimator
    ordinary = mint_token(core_v1, namespace, "writer")
    assert_status(post_outcome(url, "replayed", ordinary), 401, tmp_path)
    for_estimator = core_v1.create_namespaced_service_account_token(
        "writer", namespace, {"spec": {"audiences": ["gpuplan-estimator"],
                                       "expirationSeconds": 600}}).status.token
    assert_status(post_outcome(url, "projected", str(for_estimator)), 201, tmp_path)
