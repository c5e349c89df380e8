"""A stand-in Kubernetes API server answering only TokenReviews, as a real local aiohttp server.

Unit tests of the estimator's write guard (issue #16) point its `tokenreview.TokenReviewer` at
it; the integration tests use the real testbed API server instead. It answers like
kube-apiserver: 201 with `status.authenticated` and `status.user.username` for a known token,
no `authenticated` (Go's omitempty drops the false), an empty `user` and an `error` for any
other (the shape kube-apiserver v1.37.2 answers, `REFUSED_V1_37_2`), and `status.audiences`
echoing what was asked when the token is for one of them.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from gpuplan_estimator.interfaces.http import auth, tokenreview

OPERATOR = "system:serviceaccount:gpuplan:gpuplan-operator"
TENANT = "system:serviceaccount:team-a:default"
ESTIMATOR_TOKEN = "estimator-own-token"
"""What the estimator authenticates to the API server with (checked on every review)."""
REFUSED_V1_37_2 = {
    "kind": "TokenReview", "apiVersion": "authentication.k8s.io/v1",
    "spec": {"token": "<a TokenRequest token of probe:writer>", "audiences": ["gpuplan-estimator"]},
    "status": {"user": {}, "error": "[invalid bearer token, token audiences "
                                    "[\"https://kubernetes.default.svc.cluster.local\"] is invalid "
                                    "for the target audiences [\"gpuplan-estimator\"]]"}}
"""kube-apiserver v1.37.2's answer (201 Created) to a TokenReview for the estimator's audience of
an ordinary ServiceAccount token, as recorded on the local testbed on 2026-11-28 (`kubectl create
token writer`, then `kubectl create --raw /apis/authentication.k8s.io/v1/tokenreviews -f -`; token
and managedFields elided): a refusal, not a failure to answer."""


@dataclass
class FakeApiServer:
    """Tokens → usernames (and audiences); what it was asked; how it misbehaves."""
    users: dict[str, str] = field(default_factory=lambda: {"operator-token": OPERATOR,
                                                            "tenant-token": TENANT})
    token_audiences: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Audiences a token is for; absent: the API server's own (any request without audiences)."""
    status: int = 201
    delay_s: float = 0.0
    reviews: list[dict[str, Any]] = field(default_factory=list)
    caller_headers: list[str | None] = field(default_factory=list)
    url: str = ""

    async def _review(self, request: web.Request) -> web.Response:
        self.caller_headers.append(request.headers.get("Authorization"))
        if request.headers.get("Authorization") != f"Bearer {ESTIMATOR_TOKEN}":
            return web.json_response({"kind": "Status", "code": 401}, status=401)
        body = await request.json()
        self.reviews.append(body)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status >= 300:
            return web.json_response({"kind": "Status", "code": self.status}, status=self.status)
        return web.json_response({**body, "status": self.verdict(body["spec"])}, status=201)

    def verdict(self, spec: Mapping[str, Any]) -> dict[str, Any]:
        """`status` of a TokenReview of `spec`, as kube-apiserver fills it in."""
        token, wanted = spec["token"], list(spec.get("audiences") or [])
        username = self.users.get(token)
        has = self.token_audiences.get(token)
        granted = [a for a in wanted if has is not None and a in has] if wanted else []
        if username is None or (wanted and not granted) or (not wanted and has is not None):
            return {"user": {}, "error": "[invalid bearer token, token lookup failed]"}
        return {"authenticated": True, "audiences": granted or ["https://kubernetes.default.svc"],
                "user": {"username": username, "uid": "u", "groups": ["system:serviceaccounts"]}}


@asynccontextmanager
async def serving(fake: FakeApiServer) -> AsyncIterator[FakeApiServer]:
    """Run `fake` on a free 127.0.0.1 port until the block ends (`fake.url` set)."""
    app = web.Application()
    app.router.add_post(tokenreview.TOKENREVIEWS_PATH, fake._review)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    fake.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield fake
    finally:
        await runner.cleanup()


def guard_for(url: str, *, allowed: tuple[str, ...] = (OPERATOR,), audiences: tuple[str, ...] = (),
              timeout_s: float = 5.0, ttl_s: float = 60.0, entries: int = 1024,
              clock: auth.Clock | None = None) -> auth.WriteGuard:
    """A tokenreview guard asking the API server at `url` as the estimator."""
    settings = auth.WriteAuthSettings(mode="tokenreview", allowed_subjects=allowed,
                                      audiences=audiences, timeout_s=timeout_s,
                                      cache_ttl_s=ttl_s, cache_entries=entries)
    api = tokenreview.ApiServer(url, ssl.create_default_context(), token=ESTIMATOR_TOKEN)
    reviewer = tokenreview.TokenReviewer(api, timeout_s=timeout_s)
    if clock is None:
        return auth.WriteGuard(settings, reviewer)
    return auth.WriteGuard(settings, reviewer, clock=clock)
