"""Writes need a verified ServiceAccount (issue #16): the real service, a real SQLite database,
and a real local HTTP server answering TokenReviews (`gpuplan_testing.tokenreviews`)."""

from __future__ import annotations

import asyncio
import base64
import pathlib
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import onnx
import pytest
from aiohttp.test_utils import TestClient, TestServer

from gpuplan_estimator.interfaces.cli import main, serving
from gpuplan_estimator.interfaces.http import auth, service, tokenreview
from gpuplan_estimator.perfdb import PerfStore
from gpuplan_testing import tokenreviews as tr
from gpuplan_testing.contexts import roofline_context

LIGHT = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
RESNET50_B64 = base64.b64encode((LIGHT / "light_resnet50.onnx").read_bytes()).decode()
T4_ESTIMATE = {"model_onnx_b64": RESNET50_B64,
               "training": {"batch_size": 8, "dataset_size": 800, "epochs": 1},
               "devices": ["Tesla T4"]}


def t4_outcome(uid: str) -> dict[str, Any]:
    """A hostile client's claim: a T4 job took 3.4x its estimate."""
    return {"job_uid": uid, "gpu_type": "Tesla T4", "gpu_count": 1, "estimated_seconds": 100.0,
            "actual_seconds": 340.0, "calibration_factor": 1.0}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@asynccontextmanager
async def estimator(db_url: str, guard: auth.WriteGuard | None) -> AsyncIterator[TestClient]:
    app = service.make_app(service.ServiceState(roofline_context),
                           service.ServiceSettings(bundle_poll_s=3600, workers=1),
                           outcome_sink=serving.perfdb_outcome_sink(db_url),
                           outcome_history=serving.perfdb_outcome_history(db_url),
                           coverage_source=serving.perfdb_coverage_source(db_url),
                           write_guard=guard)
    async with TestClient(TestServer(app)) as client:
        yield client


async def t4_step_ms(client: TestClient) -> float:
    resp = await client.post("/v1/estimate", json=T4_ESTIMATE)
    assert resp.status == 200, await resp.text()
    return float((await resp.json())["devices"][0]["calibrated_step_time_ms"])


async def error_of(resp: Any) -> dict[str, Any]:
    body = await resp.json()
    assert set(body) == {"error"}, body
    return dict(body["error"])


def test_only_an_allowed_service_account_may_post_outcomes(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"

    async def main_() -> None:
        async with tr.serving(tr.FakeApiServer()) as api, \
                estimator(url, tr.guard_for(api.url)) as client:
            resp = await client.post("/v1/outcomes", json=t4_outcome("none"))
            assert resp.status == 401
            assert resp.headers["WWW-Authenticate"].startswith("Bearer")
            err = await error_of(resp)
            assert err["reason"] == "Unauthenticated" and "Bearer" in err["message"]
            assert api.reviews == []  # nothing to ask the API server about
            for header in ("Basic b3A6cHc=", "Bearer", "Bearer a b"):
                resp = await client.post("/v1/outcomes", json=t4_outcome("x"),
                                         headers={"Authorization": header})
                assert resp.status == 401, header
            resp = await client.post("/v1/outcomes", json=t4_outcome("garbage"),
                                     headers=bearer("not-a-token"))
            assert resp.status == 401
            assert "not accepted" in (await error_of(resp))["message"]
            resp = await client.post("/v1/outcomes", json=t4_outcome("tenant"),
                                     headers=bearer("tenant-token"))
            assert resp.status == 403
            err = await error_of(resp)
            assert err["reason"] == "Forbidden" and tr.TENANT in err["message"]
            resp = await client.post("/v1/outcomes", json=t4_outcome("op"),
                                     headers=bearer("operator-token"))
            assert resp.status == 201, await resp.text()
            # The estimator asked as itself, with the caller's token in the spec only.
            assert set(api.caller_headers) == {f"Bearer {tr.ESTIMATOR_TOKEN}"}
            assert [r["spec"] for r in api.reviews] == [
                {"token": "not-a-token"}, {"token": "tenant-token"}, {"token": "operator-token"}]
            # Reads stay open.
            for path in ("/v1/models", "/v1/coverage", "/healthz"):
                assert (await client.get(path)).status == 200, path
            assert (await client.post("/v1/estimate", json=T4_ESTIMATE)).status == 200
            # Bundle activation is a write too: refused before anything else is looked at.
            resp = await client.post("/v1/models/3/activate", json={"reason": "x"})
            assert resp.status == 401
            resp = await client.post("/v1/models/3/activate", json={"reason": "x"},
                                     headers=bearer("tenant-token"))
            assert resp.status == 403
            resp = await client.post("/v1/models/3/activate", json={"reason": "x"},
                                     headers=bearer("operator-token"))
            assert resp.status == 503  # let through: this service has no database activator

    asyncio.run(main_())
    assert list(PerfStore.open(url).job_outcomes()["job_uid"]) == ["op"]


@pytest.mark.parametrize("guarded", [True, False])
def test_three_unauthenticated_posts_no_longer_move_a_t4_prediction(
        tmp_path: pathlib.Path, guarded: bool) -> None:
    """Issue #16's reproduction; unguarded (the control) the same posts do move it."""
    url = f"sqlite:///{tmp_path / 'perf.db'}"

    async def main_() -> tuple[float, float, list[int]]:
        async with tr.serving(tr.FakeApiServer()) as api:
            guard = tr.guard_for(api.url) if guarded else None
            async with estimator(url, guard) as client:
                before = await t4_step_ms(client)
                statuses = [(await client.post("/v1/outcomes", json=t4_outcome(f"h{i}"))).status
                            for i in range(3)]
                return before, await t4_step_ms(client), statuses

    before, after, statuses = asyncio.run(main_())
    if guarded:
        assert statuses == [401] * 3
        assert after == before
    else:
        assert statuses == [201] * 3
        assert after > 1.5 * before


def test_a_verified_token_is_cached_by_hash_for_its_ttl_in_a_bounded_cache(
        tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    now = [1000.0]
    api_users = {f"op{i}": tr.OPERATOR for i in range(3)}

    async def main_() -> None:
        async with tr.serving(tr.FakeApiServer(users=api_users)) as api:
            guard = tr.guard_for(api.url, ttl_s=30, entries=2, clock=lambda: now[0])
            async with estimator(url, guard) as client:
                for uid in ("a", "b"):
                    resp = await client.post("/v1/outcomes", json=t4_outcome(uid),
                                             headers=bearer("op0"))
                    assert resp.status == 201
                assert len(api.reviews) == 1
                assert "op0" not in repr(guard.verified._by_digest)  # hashes only
                now[0] += 31  # past the TTL: asked again
                resp = await client.post("/v1/outcomes", json=t4_outcome("c"),
                                         headers=bearer("op0"))
                assert resp.status == 201 and len(api.reviews) == 2
                for token in ("op1", "op2"):
                    await client.post("/v1/outcomes", json=t4_outcome(token),
                                      headers=bearer(token))
                assert len(guard.verified) == 2  # op0 evicted, least recently used
                await client.post("/v1/outcomes", json=t4_outcome("d"), headers=bearer("op0"))
                assert len(api.reviews) == 5

    asyncio.run(main_())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("trouble", ["down", "slow", "refused"])
def test_an_unreachable_api_server_fails_closed_with_503(
        tmp_path: pathlib.Path, trouble: str) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    fake = tr.FakeApiServer(delay_s=5.0 if trouble == "slow" else 0.0,
                            status=403 if trouble == "refused" else 201)

    async def main_() -> float:
        async with tr.serving(fake) as api:
            target = f"http://127.0.0.1:{_closed_port()}" if trouble == "down" else api.url
            async with estimator(url, tr.guard_for(target, timeout_s=0.5)) as client:
                loop = asyncio.get_running_loop()
                start = loop.time()
                resp = await client.post("/v1/outcomes", json=t4_outcome("x"),
                                         headers=bearer("operator-token"))
                took = loop.time() - start
                assert resp.status == 503
                err = await error_of(resp)
                assert err["reason"] == "AuthUnavailable"
                return took

    took = asyncio.run(main_())
    assert took < 3.0  # the review's own timeout, not the fake's 5 s
    assert PerfStore.open(url).job_outcomes().empty


def test_audiences_are_requested_and_checked(tmp_path: pathlib.Path) -> None:
    url = f"sqlite:///{tmp_path / 'perf.db'}"
    fake = tr.FakeApiServer(
        users={"scoped": tr.OPERATOR, "apiserver-only": tr.OPERATOR},
        token_audiences={"scoped": ("gpuplan-estimator",)})

    async def main_() -> None:
        async with tr.serving(fake) as api, estimator(
                url, tr.guard_for(api.url, audiences=("gpuplan-estimator",))) as client:
            resp = await client.post("/v1/outcomes", json=t4_outcome("a"),
                                     headers=bearer("scoped"))
            assert resp.status == 201
            resp = await client.post("/v1/outcomes", json=t4_outcome("b"),
                                     headers=bearer("apiserver-only"))
            assert resp.status == 401
            assert {tuple(r["spec"]["audiences"]) for r in api.reviews} == {
                ("gpuplan-estimator",)}

    asyncio.run(main_())


def test_a_review_for_other_audiences_than_asked_is_not_accepted() -> None:
    """The client checks status.audiences itself, as the TokenReview API asks clients to."""
    class Reviewer:
        async def review(self, token: str, audiences: Any) -> tokenreview.Review:
            return tokenreview.Review(True, tr.OPERATOR, ("someone-else",))

        async def close(self) -> None:
            return None

    guard = auth.WriteGuard(auth.WriteAuthSettings(
        mode="tokenreview", allowed_subjects=(tr.OPERATOR,), audiences=("gpuplan-estimator",)),
        Reviewer())
    with pytest.raises(auth.Denied) as denied:
        asyncio.run(guard.check("Bearer t"))
    assert denied.value.status == 401


def test_the_api_servers_refusal_is_a_401_and_only_a_failed_review_a_503() -> None:
    """A TokenReview the API server answered, with `authenticated` left out and an `error`
    (kube-apiserver v1.37.2's wrong-audience answer), is a refused caller: 401, never the 503
    that only a review that could not be had gets."""
    review = tokenreview.parse_review(tr.REFUSED_V1_37_2)
    assert review == tokenreview.Review(False, "", (), tr.REFUSED_V1_37_2["status"]["error"])

    class Recorded:
        """Answers every review with one document, as `TokenReviewer.review` parses it."""

        def __init__(self, document: Any) -> None:
            self.document = document

        async def review(self, token: str, audiences: Any) -> tokenreview.Review:
            return tokenreview.parse_review(self.document)

        async def close(self) -> None:
            return None

    settings = auth.WriteAuthSettings(mode="tokenreview", allowed_subjects=(tr.OPERATOR,),
                                      audiences=("gpuplan-estimator",))
    statuses = {}
    for name, document in {"refused": tr.REFUSED_V1_37_2,
                           "no status": {"kind": "Status", "code": 500}}.items():
        with pytest.raises(auth.Denied) as denied:
            asyncio.run(auth.WriteGuard(settings, Recorded(document)).check("Bearer t"))
        statuses[name] = (denied.value.status, denied.value.reason)
    assert statuses == {"refused": (401, "Unauthenticated"),
                        "no status": (503, "AuthUnavailable")}


def serve_args(*argv: str) -> Any:
    return main.build_parser(plugins=True).parse_args(["serve", *argv])


@pytest.mark.parametrize(("argv", "env", "mode", "subjects"), [
    ((), {}, "none", ()),
    (("--host", "::1"), {}, "none", ()),
    (("--host", "0.0.0.0", "--write-auth", "tokenreview", "--write-allowed-subjects",
      f"{tr.OPERATOR}, {tr.TENANT}"), {}, "tokenreview", (tr.OPERATOR, tr.TENANT)),
    (("--host", "0.0.0.0"), {"GPUPLAN_WRITE_AUTH": "tokenreview",
                             "GPUPLAN_WRITE_ALLOWED_SUBJECTS": tr.OPERATOR},
     "tokenreview", (tr.OPERATOR,)),
    (("--host", "0.0.0.0", "--write-auth", "none"), {}, "none", ()),
    # A flag wins over its variable.
    (("--write-auth", "none"), {"GPUPLAN_WRITE_AUTH": "tokenreview"}, "none", ()),
])
def test_write_auth_settings_from_flags_and_env(
        argv: tuple[str, ...], env: dict[str, str], mode: str, subjects: tuple[str, ...]) -> None:
    got = serving.write_auth_settings(serve_args(*argv), env)
    assert (got.mode, got.allowed_subjects) == (mode, subjects)


def test_audiences_kubeconfig_and_timeouts_from_flags_and_env() -> None:
    got = serving.write_auth_settings(serve_args(
        "--write-auth", "tokenreview", "--write-allowed-subjects", tr.OPERATOR,
        "--write-auth-timeout", "2", "--write-auth-cache-ttl", "1m"),
        {"GPUPLAN_WRITE_AUTH_AUDIENCES": "a,b", "GPUPLAN_WRITE_AUTH_KUBECONFIG": "/k"})
    assert (got.audiences, got.kubeconfig, got.timeout_s, got.cache_ttl_s) == (
        ("a", "b"), "/k", 2.0, 60.0)


@pytest.mark.parametrize(("argv", "message"), [
    (("--host", "0.0.0.0"), "reachable from other machines"),
    (("--write-auth", "tokenreview"), "at least one"),
    (("--write-auth", "tokenreview", "--write-allowed-subjects", "alice"),
     "'alice' is not system:serviceaccount"),
    (("--write-auth", "tokenreview", "--write-allowed-subjects", tr.OPERATOR,
      "--write-auth-timeout", "0"), "--write-auth-timeout"),
])
def test_bad_write_auth_settings_are_refused_naming_the_flag(
        argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(Exception, match=message):
        serving.write_auth_settings(serve_args(*argv), {})


def test_serve_refuses_to_start_a_public_listener_without_a_write_auth_mode(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main.main(["serve", "--host", "0.0.0.0", "--port", "1"])
    assert code == 2
    assert "--write-auth" in capsys.readouterr().err


def test_tokenreview_without_credentials_is_refused_at_start(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "GPUPLAN_WRITE_AUTH_KUBECONFIG"):
        monkeypatch.delenv(name, raising=False)
    code = main.main(["serve", "--write-auth", "tokenreview", "--write-allowed-subjects",
                      tr.OPERATOR, "--port", "1"])
    assert code == 2
    assert "--write-auth-kubeconfig" in capsys.readouterr().err


def test_kubeconfig_with_a_token_file_reaches_the_api_server(tmp_path: pathlib.Path) -> None:
    """The estimator's own token is read from its file on every call (tokens rotate)."""
    token_file = tmp_path / "token"
    token_file.write_text("stale\n")

    async def main_() -> tuple[bool, bool]:
        async with tr.serving(tr.FakeApiServer()) as api:
            (tmp_path / "kubeconfig").write_text(f"""
apiVersion: v1
kind: Config
clusters: [{{name: c, cluster: {{server: "{api.url}"}}}}]
users: [{{name: u, user: {{tokenFile: token}}}}]
contexts: [{{name: x, context: {{cluster: c, user: u}}}}]
current-context: x
""")
            reviewer = tokenreview.TokenReviewer(
                tokenreview.from_kubeconfig(tmp_path / "kubeconfig"), timeout_s=5)
            try:
                with pytest.raises(tokenreview.ReviewUnavailable, match="401"):
                    await reviewer.review("operator-token", ())
                token_file.write_text(tr.ESTIMATOR_TOKEN + "\n")  # the kubelet rotated it
                review = await reviewer.review("operator-token", ())
                garbage = await reviewer.review("garbage", ())
            finally:
                await reviewer.close()
            return review.authenticated and review.username == tr.OPERATOR, \
                garbage.authenticated

    assert asyncio.run(main_()) == (True, False)


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("::1", True), ("localhost", True), ("127.0.0.2", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("estimator.example", False)])
def test_only_loopback_listeners_default_to_open_writes(host: str, loopback: bool) -> None:
    assert auth.is_loopback(host) is loopback
    assert auth.default_mode(host) == ("none" if loopback else None)
