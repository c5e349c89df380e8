"""Model source: the URL guard (SSRF), real HTTP fetches with caps, ConfigMap keys, formats."""

from __future__ import annotations

import asyncio
import base64
import gzip
import ipaddress
import zlib
from typing import Any

import pytest
from aiohttp import web

from gpuplan_operator import modelsource
from gpuplan_operator.core import errors
from gpuplan_testing.operator_builders import LocalServer

GUARD = modelsource.UrlGuard()
LOOPBACK_OK = modelsource.UrlGuard.from_cidrs(block_private=True, cidrs=("127.0.0.0/8",))


@pytest.mark.parametrize(("ip", "reason"), [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("169.254.169.254", "metadata"), ("fd00:ec2::254", "metadata"), ("169.254.1.1", "link-local"),
    ("fe80::1", "link-local"), ("0.0.0.0", "unspecified"), ("10.1.2.3", "private"),
    ("192.168.0.1", "private"), ("100.64.0.1", "private"), ("fc00::1", "private"),
    ("224.0.0.1", "multicast"),
])
def test_blocked_addresses(ip: str, reason: str) -> None:
    got = GUARD.blocked_reason(ipaddress.ip_address(ip))
    assert got is not None and reason in got


@pytest.mark.parametrize("ip", ["93.184.216.34", "2606:2800:220:1::1", "8.8.8.8"])
def test_public_addresses_pass(ip: str) -> None:
    assert GUARD.blocked_reason(ipaddress.ip_address(ip)) is None


def test_private_allowed_by_config_but_metadata_never_implicitly() -> None:
    relaxed = modelsource.UrlGuard(block_private=False)
    assert relaxed.blocked_reason(ipaddress.ip_address("10.0.0.5")) is None
    assert relaxed.blocked_reason(ipaddress.ip_address("100.100.100.200")) is not None
    assert LOOPBACK_OK.blocked_reason(ipaddress.ip_address("127.0.0.1")) is None


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://h/m.onnx", "gopher://x",
                                 "http://169.254.169.254/latest/meta-data/", "http://[::1]/m"])
def test_check_url_refuses(url: str) -> None:
    with pytest.raises(errors.BlockedUrlError):
        modelsource.check_url(url, GUARD)


def _app() -> web.Application:
    async def model(_: web.Request) -> web.Response:
        return web.Response(body=b"\x08\x07onnx-bytes")

    async def big(_: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()  # chunked: no Content-Length to trust
        await resp.prepare(_)
        for _i in range(20):
            await resp.write(b"x" * 1024)
        return resp

    async def redirect(request: web.Request) -> web.Response:
        # Raw header: aiohttp's HTTPFound would refuse a malformed target itself.
        return web.Response(status=302, headers={"Location": request.query["to"]})

    async def status(request: web.Request) -> web.Response:
        return web.Response(status=int(request.match_info["code"]))

    async def encoded(request: web.Request) -> web.Response:
        whole = gzip.compress(b"\x08\x07" * 500)
        body = {"gzip": whole, "garbage": b"\x1f\x8b\x08\x00" + b"\xff" * 64,
                "truncated": whole[:len(whole) // 2], "deflate": zlib.compress(b"\x08\x07" * 500),
                "br": b"\x0b\x02\x80"}[request.match_info["kind"]]
        encoding = {"garbage": "gzip", "truncated": "gzip"}.get(request.match_info["kind"],
                                                                request.match_info["kind"])
        return web.Response(body=body, headers={"Content-Encoding": encoding})

    async def slow_hops(request: web.Request) -> web.Response:
        await asyncio.sleep(0.4)
        left = int(request.query["left"])
        if left == 0:
            return web.Response(body=b"\x08\x07")
        raise web.HTTPFound(f"/slow?left={left - 1}")

    async def cut_short(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Length": "1000"})
        await resp.prepare(request)
        await resp.write(b"x" * 10)
        assert request.transport is not None
        request.transport.close()  # the peer hangs up after 10 of 1000 bytes
        return resp

    app = web.Application()
    app.router.add_get("/m.onnx", model)
    app.router.add_get("/big", big)
    app.router.add_get("/redirect", redirect)
    app.router.add_get("/status/{code}", status)
    app.router.add_get("/encoded/{kind}", encoded)
    app.router.add_get("/slow", slow_hops)
    app.router.add_get("/cut", cut_short)
    return app


def _fetch(path: str, guard: modelsource.UrlGuard, *, max_bytes: int = 4096,
           host: str = "127.0.0.1", timeout_seconds: float = 5) -> Any:
    async def run() -> bytes:
        async with LocalServer(_app()) as srv:
            url = srv.url.replace("127.0.0.1", host) + path
            return await modelsource.fetch_url(url, guard=guard, max_bytes=max_bytes,
                                               timeout_seconds=timeout_seconds)
    return asyncio.run(run())


def test_fetch_allowed_network() -> None:
    assert _fetch("/m.onnx", LOOPBACK_OK) == b"\x08\x07onnx-bytes"


def test_fetch_refuses_loopback_by_default_even_by_hostname() -> None:
    with pytest.raises(errors.BlockedUrlError, match="loopback"):
        _fetch("/m.onnx", GUARD)
    with pytest.raises(errors.BlockedUrlError, match="localhost"):
        _fetch("/m.onnx", GUARD, host="localhost")


def test_redirect_to_metadata_is_refused() -> None:
    with pytest.raises(errors.BlockedUrlError, match="metadata"):
        _fetch("/redirect?to=http://169.254.169.254/latest/", LOOPBACK_OK)


def test_size_cap_on_streamed_body() -> None:
    with pytest.raises(errors.InvalidModelSourceError, match="cap"):
        _fetch("/big", LOOPBACK_OK, max_bytes=10_000)


def test_http_status_mapping() -> None:
    with pytest.raises(errors.InvalidModelSourceError, match="404"):
        _fetch("/status/404", LOOPBACK_OK)
    with pytest.raises(errors.ModelSourceUnavailableError, match="503"):
        _fetch("/status/503", LOOPBACK_OK)


def test_unreachable_is_temporary() -> None:
    async def run() -> bytes:
        return await modelsource.fetch_url("http://127.0.0.1:9/m", guard=LOOPBACK_OK,
                                           max_bytes=10, timeout_seconds=2)
    with pytest.raises(errors.ModelSourceUnavailableError):
        asyncio.run(run())


@pytest.mark.parametrize("guard", [GUARD, LOOPBACK_OK], ids=["default", "loopback-allowed"])
@pytest.mark.parametrize(("host", "needle"), [
    ("127.1", "not a canonical IPv4"), ("0177.0.0.1", "not a canonical IPv4"),
    ("2130706433", "not a canonical IPv4")])
def test_non_canonical_ipv4_hosts_are_invalid_models(guard: modelsource.UrlGuard, host: str,
                                                     needle: str) -> None:
    """aiohttp refuses these forms itself; they used to escape as its own InvalidURL."""
    with pytest.raises(errors.InvalidModelSourceError, match=needle):
        _fetch("/m.onnx", guard, host=host)


def test_unclosed_ipv6_bracket_is_an_invalid_model() -> None:
    async def run() -> bytes:
        return await modelsource.fetch_url("http://[::1/m", guard=LOOPBACK_OK, max_bytes=10,
                                           timeout_seconds=2)
    with pytest.raises(errors.InvalidModelSourceError, match="malformed"):
        asyncio.run(run())


def test_redirect_to_a_malformed_location_is_an_invalid_model() -> None:
    with pytest.raises(errors.InvalidModelSourceError, match="malformed Location"):
        _fetch("/redirect?to=http://[::1/m", LOOPBACK_OK)


@pytest.mark.parametrize("kind", ["gzip", "deflate"])
def test_content_encoding_is_decoded(kind: str) -> None:
    assert _fetch(f"/encoded/{kind}", LOOPBACK_OK, max_bytes=1000) == b"\x08\x07" * 500


@pytest.mark.parametrize(("kind", "needle"), [
    ("garbage", "does not match its Content-Encoding"), ("truncated", "truncated"),
    ("br", "unsupported Content-Encoding")])
def test_broken_content_encoding_is_an_invalid_model(kind: str, needle: str) -> None:
    with pytest.raises(errors.InvalidModelSourceError, match=needle):
        _fetch(f"/encoded/{kind}", LOOPBACK_OK)


def test_size_cap_applies_to_the_decoded_body() -> None:
    with pytest.raises(errors.InvalidModelSourceError, match="once gzip-decoded"):
        _fetch("/encoded/gzip", LOOPBACK_OK, max_bytes=999)


def test_body_cut_short_is_temporary() -> None:
    with pytest.raises(errors.ModelSourceUnavailableError, match=r"cut short|unreachable"):
        _fetch("/cut", LOOPBACK_OK)


def test_timeout_is_one_deadline_over_all_redirect_hops() -> None:
    """Four hops of 0.4 s each: every hop is within 1 s, the chain is not."""
    assert _fetch("/slow?left=3", LOOPBACK_OK, timeout_seconds=5) == b"\x08\x07"
    with pytest.raises(errors.ModelSourceUnavailableError, match="all redirect hops"):
        _fetch("/slow?left=3", LOOPBACK_OK, timeout_seconds=1.0)


def test_config_map_binary_data_then_data() -> None:
    cm = {"metadata": {"name": "m"}, "binaryData": {"a": base64.b64encode(b"\x00\x01").decode()},
          "data": {"b": "text"}}
    assert modelsource.from_config_map(cm, "a", 10) == b"\x00\x01"
    assert modelsource.from_config_map(cm, "b", 10) == b"text"
    with pytest.raises(errors.InvalidModelSourceError, match=r"no key 'c'.*\['a', 'b'\]"):
        modelsource.from_config_map(cm, "c", 10)
    with pytest.raises(errors.InvalidModelSourceError, match="exceeds"):
        modelsource.from_config_map(cm, "b", 3)


@pytest.mark.parametrize(("data", "fmt", "ok"), [
    (b"\x1f\x8bxxx", "gzip", True), (b"\x1f\x8bxxx", "auto", True), (b"\x08\x07", "raw", True),
    (b"\x08\x07", "gzip", False), (b"\x28\xb5\x2f\xfdx", "xz", False),
])
def test_format_check(data: bytes, fmt: str, ok: bool) -> None:
    if ok:
        modelsource.check_format(data, fmt)
    else:
        with pytest.raises(errors.InvalidModelSourceError, match=r"spec\.model\.format"):
            modelsource.check_format(data, fmt)


@pytest.mark.parametrize(("data", "needle"), [
    (b"{not json", "not JSON"), (b"[1, 2]", "not a Hugging Face config.json"),
    (b'{"n_layer": 2}', "not a Hugging Face config.json"), (b"\xff\xfe", "not JSON")])
def test_a_hf_config_must_be_a_config_json(data: bytes, needle: str) -> None:
    with pytest.raises(errors.InvalidModelSourceError, match=f"configmap c/k: {needle}"):
        modelsource.check_hf_config(data, "configmap c/k")
    modelsource.check_hf_config(b'{"model_type": "llama"}', "configmap c/k")


def test_a_server_that_does_not_speak_http_is_an_invalid_model() -> None:
    """Any other client failure (here aiohttp's parser error) still ends in a domain error."""
    async def garbage(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"SSH-2.0-OpenSSH_9.6\r\n\r\n")
        await writer.drain()
        writer.close()

    async def run() -> bytes:
        server = await asyncio.start_server(garbage, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            return await modelsource.fetch_url(f"http://127.0.0.1:{port}/m", guard=LOOPBACK_OK,
                                               max_bytes=10, timeout_seconds=5)
    with pytest.raises(errors.InvalidModelSourceError,
                       match=r"could not be fetched: .*Bad status line"):
        asyncio.run(run())
