"""Issue #33: whose share of the estimator a request uses comes from a verified identity, never
from a header the client picks; tokens for the wrong audience (a tenant's own, or one lifted
from a Job) are not the operator's."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from gpuplan_estimator.interfaces.http import admission, auth, service
from gpuplan_testing import tokenreviews as tr
from gpuplan_testing.contexts import roofline_context

AUDIENCE = "gpuplan-estimator"


def bearer(token: str) -> str:
    return f"Bearer {token}"


@pytest.mark.parametrize(("authorization", "key"), [
    (None, "10.0.0.9/"),                                  # no token: the header is ignored
    (bearer("tenant-token"), "10.0.0.9/"),                # verified, not the operator
    (bearer("not-a-token"), "10.0.0.9/"),                 # rejected by the API server
    (bearer("operator-default-token"), "10.0.0.9/"),      # the operator's, wrong audience
    (bearer("operator-token"), f"{tr.OPERATOR}/team-b"),  # the operator speaks for team-b
])
def test_only_the_verified_operator_may_name_the_tenant(authorization: str | None,
                                                        key: str) -> None:
    async def main() -> None:
        api_server = tr.FakeApiServer(
            users={"operator-token": tr.OPERATOR, "operator-default-token": tr.OPERATOR,
                   "tenant-token": tr.TENANT},
            token_audiences={"operator-token": (AUDIENCE,), "tenant-token": (AUDIENCE,)})
        async with tr.serving(api_server) as api:
            guard = tr.guard_for(api.url, audiences=(AUDIENCE,))
            try:
                assert await guard.fairness_key(authorization, "team-b", "10.0.0.9") == key
            finally:
                await guard.close()

    asyncio.run(main())


def test_open_writes_keep_the_address_and_header_key() -> None:
    guard = auth.WriteGuard(auth.OPEN)
    assert asyncio.run(guard.fairness_key(None, "team-a", "10.0.0.9")) == \
        admission.client_key("team-a", "10.0.0.9")


def test_inventing_tenant_headers_does_not_buy_more_queue() -> None:
    """Behind tokenreview, a client without the operator's token that sends a new header per
    request still queues as one client: its bodies count against one budget."""
    async def main() -> None:
        async with tr.serving(tr.FakeApiServer()) as api:
            app = service.make_app(
                service.ServiceState(roofline_context),
                service.ServiceSettings(bundle_poll_s=3600, workers=1, max_body_bytes=4096,
                                        body_bytes_per_client=4096, body_bytes_total=1 << 20),
                CollectorRegistry(), write_guard=tr.guard_for(api.url))
            async with TestClient(TestServer(app)) as client:
                _, writer = await asyncio.open_connection(client.host, client.port)
                writer.write(b"POST /v1/plans HTTP/1.1\r\nHost: x\r\nX-Gpuplan-Client: a\r\n"
                             b"Content-Length: 4096\r\n\r\n")  # holds the whole budget
                await writer.drain()
                await asyncio.sleep(0.3)
                resp = await client.post("/v1/plans", data=b"{}",
                                         headers={admission.CLIENT_HEADER: "b"})
                assert resp.status == 429, await resp.text()
                writer.close()

    asyncio.run(main())
