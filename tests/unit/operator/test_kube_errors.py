"""How `kube` classifies API answers, against a real HTTP server on loopback: 4xx stays an
ApiError (the caller decides), 429/5xx/unreachable become KubeApiUnavailableError (retry)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import kubernetes
import pytest
from aiohttp import web

from gpuplan_operator import kube
from gpuplan_operator.core import errors
from gpuplan_testing.operator_builders import LocalServer

JOB = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "tj-train"}}


def _api_server(status: int, message: str = "") -> web.Application:
    async def create(_: web.Request) -> web.Response:
        body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
                "code": status}
        return web.json_response(body if status >= 300 else JOB, status=status)

    async def read(_: web.Request) -> web.Response:
        return web.json_response({**JOB, "metadata": {"name": "tj-train", "uid": "old"}})

    app = web.Application()
    app.router.add_post("/apis/batch/v1/namespaces/ns/jobs", create)
    app.router.add_get("/apis/batch/v1/namespaces/ns/jobs/tj-train", read)
    return app


def _client(url: str) -> kube.Kube:
    config = kubernetes.client.Configuration(host=url)
    config.retries = 0  # the caller retries with backoff, not urllib3
    return kube.Kube(kubernetes.client.ApiClient(config))


def _create(status: int, message: str = "") -> tuple[dict[str, Any], bool]:
    async def go() -> tuple[dict[str, Any], bool]:
        async with LocalServer(_api_server(status, message)) as srv:
            return await _client(srv.url).create_job("ns", JOB)
    return asyncio.run(go())


def test_created_and_already_existing() -> None:
    assert _create(201) == (JOB, True)
    existing, created = _create(409, "already exists")
    assert existing["metadata"]["uid"] == "old" and created is False


@pytest.mark.parametrize("status", [400, 403, 422])
def test_4xx_is_an_api_error_carrying_the_servers_message(status: int) -> None:
    with pytest.raises(kube.ApiError) as info:
        _create(status, 'Job.batch "tj-train" is invalid: spec.template.spec.restartPolicy')
    assert info.value.status == status
    assert kube.rejection_message(info.value) == (
        'Job.batch "tj-train" is invalid: spec.template.spec.restartPolicy')


@pytest.mark.parametrize("status", [429, 500, 503])
def test_throttling_and_5xx_are_temporary(status: int) -> None:
    with pytest.raises(errors.KubeApiUnavailableError, match=f"answered {status}: busy"):
        _create(status, "busy")


def test_unreachable_api_is_temporary() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(errors.KubeApiUnavailableError, match="unreachable"):
        asyncio.run(_client(f"http://127.0.0.1:{port}").create_job("ns", JOB))


def test_rejection_message_without_a_status_body() -> None:
    exc = kube.ApiError(status=403, reason="Forbidden")
    exc.body = "<html>proxy says no</html>"
    assert kube.rejection_message(exc) == "403 Forbidden"
