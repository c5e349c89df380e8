"""Resolve a TrainingJob's model bytes: a ConfigMap key, or an http(s) URL behind an address guard.

The URL guard exists because the operator runs with cluster credentials inside the cluster: an
arbitrary user-supplied URL could otherwise read the cloud metadata service or internal services
(SSRF). Every address a host resolves to is checked, literal IPs included, and each redirect hop
is checked again.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import ipaddress
import json
import socket
import zlib
from collections.abc import Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult

from gpuplan_estimator.core.vocabulary import MODEL_COMPRESSION_MAGIC
from gpuplan_operator.core import errors

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_REDIRECTS = 3
# HTTP Content-Encodings the fetch accepts, as zlib window bits (gzip header / zlib header).
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
# Metadata endpoints of the big clouds (AWS/GCP/Azure/OCI share 169.254.169.254, which is
# link-local anyway); listed so they stay blocked even when private ranges are allowed.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254", "169.254.170.2", "fd00:ec2::254", "100.100.100.200", "168.63.129.16",
))


@dataclasses.dataclass(frozen=True)
class UrlGuard:
    """Which addresses a model URL may resolve to (SSRF guard); allowed networks win."""

    block_private: bool = True
    allowed_networks: tuple[IpNetwork, ...] = ()

    @classmethod
    def from_cidrs(cls, *, block_private: bool, cidrs: tuple[str, ...]) -> UrlGuard:
        """A guard from CIDR strings, as settings give them; host bits are ignored."""
        return cls(block_private, tuple(ipaddress.ip_network(c, strict=False) for c in cidrs))

    def blocked_reason(self, ip: IpAddress) -> str | None:
        """Why `ip` may not be fetched from, or None when it may."""
        if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        if any(ip in net for net in self.allowed_networks):
            return None
        if ip in METADATA_ADDRESSES:
            return "cloud metadata address"
        checks = (("loopback", ip.is_loopback), ("link-local", ip.is_link_local),
                  ("unspecified", ip.is_unspecified), ("multicast", ip.is_multicast),
                  ("reserved", ip.is_reserved))
        for name, hit in checks:
            if hit:
                return f"{name} address"
        if self.block_private and (ip.is_private or ip in ipaddress.ip_network("100.64.0.0/10")):
            return "private address"
        return None

    def check(self, host: str, ip: IpAddress) -> None:
        """Raise BlockedUrlError when `ip`, an address of `host`, may not be fetched from."""
        reason = self.blocked_reason(ip)
        if reason:
            raise errors.BlockedUrlError(
                f"model URL host {host!r} resolves to {ip}: {reason} refused")


class GuardedResolver(AbstractResolver):
    """Resolves with the system resolver and refuses the whole host if any address is blocked."""

    def __init__(self, guard: UrlGuard) -> None:
        self._guard = guard
        self._inner = aiohttp.ThreadedResolver()

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        """The host's addresses; BlockedUrlError if any of them is blocked."""
        results = await self._inner.resolve(host, port, family)
        for r in results:
            self._guard.check(host, ipaddress.ip_address(r["host"]))
        return results

    async def close(self) -> None:
        """Close the system resolver underneath."""
        await self._inner.close()


def check_url(url: str, guard: UrlGuard) -> None:
    """Scheme and literal-IP checks (aiohttp skips the resolver for literal IPs)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError as exc:  # e.g. an unclosed IPv6 bracket: `http://[::1/m`
        raise errors.InvalidModelSourceError(f"model URL {url!r} is malformed: {exc}") from exc
    if parts.scheme not in {"http", "https"}:
        raise errors.BlockedUrlError(f"model URL scheme {parts.scheme!r} refused: use http(s)")
    if not host:
        raise errors.BlockedUrlError(f"model URL {url!r} has no host")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return
    guard.check(host, ip)


async def fetch_url(url: str, *, guard: UrlGuard, max_bytes: int, timeout_seconds: float) -> bytes:
    """GET `url` with the guard, a size cap and one deadline; redirects are re-checked.

    `timeout_seconds` is a total deadline over every redirect hop and the body, so a chain of
    slow hops cannot take a multiple of it. Every failure is a domain error, so the TrainingJob
    always gets a condition: ModelSourceUnavailableError when a retry may help (timeouts,
    refused connections, truncated bodies), InvalidModelSourceError when it will not.
    """
    first_url = url
    try:
        async with asyncio.timeout(timeout_seconds):
            return await _fetch_following_redirects(url, guard, max_bytes)
    except errors.OperatorError:
        raise
    except TimeoutError as exc:
        raise errors.ModelSourceUnavailableError(
            f"model URL {first_url!r}: no complete answer within {timeout_seconds:g}s "
            "(all redirect hops together)") from exc
    except aiohttp.ClientPayloadError as exc:
        raise errors.ModelSourceUnavailableError(
            f"model URL {first_url!r}: body cut short: {exc}") from exc
    except aiohttp.InvalidURL as exc:  # e.g. `127.1` or `0177.0.0.1`: not canonical IPv4
        raise errors.InvalidModelSourceError(f"model URL {first_url!r} is invalid: {exc}") from exc
    except aiohttp.ClientConnectionError as exc:
        raise errors.ModelSourceUnavailableError(
            f"model URL {first_url!r} unreachable: {type(exc).__name__}: {exc}") from exc
    except Exception as exc:
        # Anything else (a malformed response, an unexpected client error) repeats on retry:
        # say so in a condition rather than let the framework retry it blindly forever.
        raise errors.InvalidModelSourceError(
            f"model URL {first_url!r} could not be fetched: {type(exc).__name__}: {exc}") from exc


async def _fetch_following_redirects(url: str, guard: UrlGuard, max_bytes: int) -> bytes:
    connector = aiohttp.TCPConnector(resolver=GuardedResolver(guard), force_close=True)
    # No per-request timeout: the caller's deadline covers the whole chain. Content-Encoding is
    # decoded here, not by aiohttp, which returns a truncated gzip stream's prefix as if whole.
    async with aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                     timeout=aiohttp.ClientTimeout(total=None)) as session:
        for _ in range(MAX_REDIRECTS + 1):
            check_url(url, guard)
            async with session.get(url, allow_redirects=False,
                                   headers={"Accept-Encoding": ", ".join(_WBITS)}) as resp:
                if resp.status in {301, 302, 303, 307, 308} and "Location" in resp.headers:
                    url = _redirect_target(url, resp.headers["Location"])
                    continue
                return await _read_body(resp, url, max_bytes)
    raise errors.InvalidModelSourceError(f"model URL: more than {MAX_REDIRECTS} redirects")


def _redirect_target(url: str, location: str) -> str:
    try:
        return urljoin(url, location)
    except ValueError as exc:
        raise errors.InvalidModelSourceError(
            f"model URL {url!r} redirects to a malformed Location {location!r}: {exc}") from exc


async def _read_body(resp: aiohttp.ClientResponse, url: str, max_bytes: int) -> bytes:
    if resp.status >= 500:
        raise errors.ModelSourceUnavailableError(f"model URL {url!r} answered {resp.status}")
    if resp.status != 200:
        raise errors.InvalidModelSourceError(f"model URL {url!r} answered {resp.status}")
    if resp.content_length is not None and resp.content_length > max_bytes:
        raise errors.InvalidModelSourceError(
            f"model URL {url!r}: {resp.content_length} bytes exceeds the cap of {max_bytes}")
    body = bytearray()
    async for chunk in resp.content.iter_chunked(64 * 1024):
        body += chunk
        if len(body) > max_bytes:
            raise errors.InvalidModelSourceError(
                f"model URL {url!r}: larger than the cap of {max_bytes}")
    return _decode(bytes(body), resp.headers.get("Content-Encoding", ""), url, max_bytes)


def _decode(body: bytes, encoding: str, url: str, max_bytes: int) -> bytes:
    """Undo the HTTP Content-Encoding; the cap applies to the decoded bytes too."""
    name = encoding.strip().lower()
    if name in {"", "identity"}:
        return body
    if name not in _WBITS:
        raise errors.InvalidModelSourceError(
            f"model URL {url!r}: unsupported Content-Encoding {encoding!r} "
            f"(asked for {', '.join(_WBITS)})")
    decoder = zlib.decompressobj(_WBITS[name])
    try:
        out = decoder.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise errors.InvalidModelSourceError(
            f"model URL {url!r}: body does not match its Content-Encoding {name}: {exc}") from exc
    if len(out) > max_bytes:
        raise errors.InvalidModelSourceError(
            f"model URL {url!r}: larger than the cap of {max_bytes} once {name}-decoded")
    if not decoder.eof:
        raise errors.InvalidModelSourceError(
            f"model URL {url!r}: {name} Content-Encoding stream is truncated")
    return out


def from_config_map(config_map: Mapping[str, Any], key: str, max_bytes: int) -> bytes:
    """The bytes under `key` (binaryData first, then data), capped at `max_bytes`."""
    name = (config_map.get("metadata") or {}).get("name", "?")
    binary, text = config_map.get("binaryData") or {}, config_map.get("data") or {}
    if key in binary:
        try:
            data = base64.b64decode(binary[key], validate=True)
        except (binascii.Error, ValueError) as exc:
            raise errors.InvalidModelSourceError(
                f"configmap {name}: binaryData.{key} is not base64") from exc
    elif key in text:
        data = str(text[key]).encode()
    else:
        raise errors.InvalidModelSourceError(
            f"configmap {name}: no key {key!r} in binaryData or data "
            f"(keys: {sorted([*binary, *text])})")
    if len(data) > max_bytes:
        raise errors.InvalidModelSourceError(
            f"configmap {name}/{key}: {len(data)} bytes exceeds {max_bytes}")
    if not data:
        raise errors.InvalidModelSourceError(f"configmap {name}/{key}: empty")
    return data


def check_hf_config(data: bytes, where: str) -> None:
    """A Hugging Face config.json: a JSON object with a `model_type`; InvalidModelSourceError
    naming `where` otherwise (the estimator builds the graph from it)."""
    try:
        config = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.InvalidModelSourceError(f"{where}: not JSON: {exc}") from exc
    if not isinstance(config, dict) or not isinstance(config.get("model_type"), str):
        raise errors.InvalidModelSourceError(
            f"{where}: not a Hugging Face config.json (a JSON object with a model_type)")


def check_format(data: bytes, fmt: str) -> None:
    """Verify the declared `spec.model.format` against the bytes' magic numbers."""
    detected = next((name for name, magic in MODEL_COMPRESSION_MAGIC.items()
                     if data.startswith(magic)), "raw")
    if fmt != "auto" and fmt != detected:
        raise errors.InvalidModelSourceError(
            f"spec.model.format is {fmt!r} but the model bytes look like {detected!r}")

