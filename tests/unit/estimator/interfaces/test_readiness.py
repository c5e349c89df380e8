"""Issue #33: the estimator's port opens before the bundle is loaded, so /readyz says 503 while
it loads; metrics can have a port of their own that answers nothing else; SQLite on an emptyDir
is announced in the log."""

from __future__ import annotations

import asyncio
import functools
import logging
import pathlib

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuplan_estimator.interfaces.cli import serving
from gpuplan_estimator.interfaces.http import service
from gpuplan_testing import contexts

PLAN = {"training": {"batch_size": 1}}


def test_readyz_is_503_while_the_bundle_loads_and_waiting_requests_are_answered_after(
        tmp_path: pathlib.Path) -> None:
    gate = tmp_path / "loaded"

    async def main() -> None:
        state = service.ServiceState(functools.partial(contexts.gated_context, str(gate)))
        app = service.make_app(state, service.ServiceSettings(bundle_poll_s=3600),
                               CollectorRegistry())
        async with TestClient(TestServer(app)) as client:
            ready = await client.get("/readyz")
            assert ready.status == 503
            assert (await ready.json())["error"]["reason"] == "NotReady"
            assert (await client.get("/healthz")).status == 200
            waiting = asyncio.create_task(client.post("/v1/plans", json=PLAN))
            await asyncio.sleep(0.3)
            assert not waiting.done()  # held for start-up, not refused
            gate.touch()
            answer = await asyncio.wait_for(waiting, 60)
            assert answer.status == 422  # read and judged: no model in the request
            assert (await client.get("/readyz")).status == 200

    asyncio.run(main())


def test_a_failed_start_fails_healthz(tmp_path: pathlib.Path) -> None:
    async def main() -> None:
        state = service.ServiceState(functools.partial(contexts.roofline_named_by_file,
                                                       str(tmp_path / "missing")))
        app = service.make_app(state, service.ServiceSettings(bundle_poll_s=3600),
                               CollectorRegistry())
        async with TestClient(TestServer(app)) as client:
            for _ in range(100):
                health = await client.get("/healthz")
                if health.status != 200:
                    break
                await asyncio.sleep(0.05)
            assert health.status == 503
            assert (await health.json())["error"]["reason"] == "StartupFailed"
            assert (await client.post("/v1/plans", json=PLAN)).status == 503

    asyncio.run(main())


def test_metrics_on_their_own_port_answer_get_only_and_leave_the_api_port() -> None:
    async def main() -> None:
        registry = CollectorRegistry()
        app = service.make_app(service.ServiceState(contexts.roofline_context),
                               service.ServiceSettings(bundle_poll_s=3600, metrics_port=0),
                               registry)
        async with TestClient(TestServer(app)) as api:
            assert (await api.get("/metrics")).status == 404
            lifecycle = app.cleanup_ctx[-1]
            assert isinstance(lifecycle, service.Lifecycle)
            metrics_app = service.make_metrics_app(lifecycle.routes)
            async with TestClient(TestServer(metrics_app)) as scraper:
                scraped = await scraper.get("/metrics")
                assert scraped.status == 200
                assert "gpuplan_estimator" in await scraped.text()
                assert (await scraper.post("/metrics")).status == 405
                assert (await scraper.post("/v1/plans", json=PLAN)).status == 404

    asyncio.run(main())


@pytest.mark.parametrize(("ephemeral", "db_url", "warned"), [
    (True, None, True), (True, "postgresql://db/gpuplan", False), (False, None, False)])
def test_sqlite_on_an_emptydir_is_announced(ephemeral: bool, db_url: str | None, warned: bool,
                                             caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert serving.warn_if_ephemeral(ephemeral, db_url) is warned
    assert ("lost at every restart" in caplog.text) is warned
