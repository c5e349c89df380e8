"""Issue #33: a request body is admitted against its client's and the service's byte budgets
before it is read, and the chart's defaults keep one client below the pod's memory limit."""

from __future__ import annotations

import asyncio
import pathlib
from collections.abc import Awaitable, Callable

import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuplan_estimator.interfaces.http import admission, intake, service
from gpuplan_testing import contexts

ROOT = pathlib.Path(__file__).parents[4]
MIB = 2**20
GIB = 2**30


def make_intake(max_body: int = 10, per_client: int = 20, total: int = 30) -> intake.Intake:
    return intake.Intake(intake.IntakeSettings(max_body, per_client, total))


def test_a_client_holds_at_most_its_budget_and_gets_it_back_when_answered() -> None:
    gate = make_intake()
    with gate.hold("a", 10), gate.hold("a", 10):
        with pytest.raises(admission.Busy, match="bytes of requests in progress"), \
                gate.hold("a", 1):
            pass
        with gate.hold("b", 5):
            assert gate.total() == 25
    assert gate.total() == 0 and gate.held("a") == 0


def test_the_service_budget_binds_across_clients() -> None:
    gate = make_intake()
    with gate.hold("a", 10), gate.hold("b", 10), gate.hold("c", 10), \
            pytest.raises(admission.Busy, match="the service holds"), gate.hold("d", 1):
        pass


def test_an_undeclared_length_reserves_the_cap_and_an_oversized_one_is_refused() -> None:
    gate = make_intake()
    with gate.hold("a", None) as reserved:
        assert reserved == 10
    with pytest.raises(intake.TooLarge), gate.hold("a", 11):
        pass


def test_inconsistent_caps_are_named() -> None:
    problems = intake.IntakeSettings(10, 5, 4).problems()
    assert any("--body-bytes-per-client" in p for p in problems)
    assert any("--body-bytes-total" in p for p in problems)


def serve(check: Callable[[TestClient], Awaitable[None]],
          settings: service.ServiceSettings) -> None:
    async def main() -> None:
        app = service.make_app(service.ServiceState(contexts.roofline_context), settings,
                               CollectorRegistry())
        async with TestClient(TestServer(app)) as client:
            await check(client)

    asyncio.run(main())


async def headers_only(client: TestClient, length: int) -> tuple[asyncio.StreamReader,
                                                                   asyncio.StreamWriter]:
    """A plan request that declares `length` bytes and sends none of them."""
    reader, writer = await asyncio.open_connection(client.host, client.port)
    writer.write(f"POST /v1/plans HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {length}\r\n\r\n".encode())
    await writer.drain()
    return reader, writer


async def plan_status_becomes(client: TestClient, status: int, within_s: float = 10.0
                              ) -> tuple[int, str]:
    """Post an empty plan request until it is answered `status` (the server takes up or lets
    go of another connection's reservation when its loop gets to it, later on a loaded
    machine), or `within_s` passes; the last status and body."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        resp = await client.post("/v1/plans", data=b"{}")
        body = await resp.text()
        if resp.status == status or asyncio.get_running_loop().time() > deadline:
            return resp.status, body
        await asyncio.sleep(0.05)


def test_a_body_past_the_clients_budget_is_refused_without_being_read() -> None:
    async def check(client: TestClient) -> None:
        _, stalled = await headers_only(client, MIB)  # holds a whole MiB, never finishes
        status, body = await plan_status_becomes(client, 429)
        assert status == 429, body
        assert "bytes of requests in progress" in body
        reader, writer = await headers_only(client, 2 * MIB)  # over the cap: 413, unread
        status_line = await asyncio.wait_for(reader.readline(), 5)
        assert b" 413 " in status_line
        for w in (stalled, writer):
            w.close()
        # the stalled request's reservation goes with its connection; then an empty plan
        # request is admitted and read, and invalid
        status, body = await plan_status_becomes(client, 422)
        assert status == 422, body

    serve(check, service.ServiceSettings(bundle_poll_s=3600, max_body_bytes=MIB,
                                         body_bytes_per_client=MIB, body_bytes_total=4 * MIB))


def chart_settings() -> service.ServiceSettings:
    values = yaml.safe_load((ROOT / "charts/gpuplan/values.yaml").read_text())["estimator"]
    return service.ServiceSettings(
        workers=values["workers"], running_per_client=values["runningPerClient"],
        worker_memory_bytes=int(values["workerMemoryGiB"] * GIB),
        max_body_bytes=values["maxBodyBytes"],
        body_bytes_per_client=values["bodyBytesPerClient"],
        body_bytes_total=values["bodyBytesTotal"])


def memory_limit_bytes() -> int:
    values = yaml.safe_load((ROOT / "charts/gpuplan/values.yaml").read_text())["estimator"]
    limit = values["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    return int(float(limit[:-2]) * GIB)


def test_with_the_charts_defaults_one_client_stays_below_the_pods_memory_limit() -> None:
    settings = chart_settings()
    assert not service.intake_settings(settings).problems()
    worst = intake.client_worst_case_bytes(service.memory_plan(settings))
    assert worst < memory_limit_bytes(), f"{worst / GIB:.2f} GiB"


def test_the_old_defaults_let_one_client_past_the_limit() -> None:
    """The arithmetic the issue names: 64 queued bodies of 64 MiB each, or two workers at 3 GiB."""
    settings = service.ServiceSettings(workers=3, worker_memory_bytes=3 * GIB,
                                       body_bytes_per_client=64 * 64 * MIB,
                                       body_bytes_total=512 * 64 * MIB)
    assert intake.client_worst_case_bytes(service.memory_plan(settings)) > memory_limit_bytes()
