"""Reading a whole HTTP body, capped: one source for every client (issue #30's CI flake).

`aiohttp.StreamReader.read(n)` returns what has arrived, up to n bytes, not the body: under
load a TokenReview's answer came back as its first 300 bytes and failed as "not JSON"
(`tests/integration/test_estimator_write_auth.py`, 2026-11-29). `read_capped` reads until the
end or past the cap. It takes any reader with an awaitable ``read(n)`` that returns ``b""`` at
the end, so this module imports no HTTP library.
"""

from __future__ import annotations

from typing import Protocol

CHUNK_BYTES = 1 << 16
"""The most one read asks for."""


class ByteStream(Protocol):
    """What `read_capped` needs of a body (`aiohttp.StreamReader` is one)."""

    async def read(self, n: int = -1) -> bytes:
        """Up to `n` bytes that have arrived; b"" at the end."""
        ...


async def read_capped(stream: ByteStream, limit_bytes: int) -> bytes:
    """The body up to its end, or its first `limit_bytes` + 1 bytes when it is longer (so a
    caller tells "too large" by the length)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit_bytes:
        chunk = await stream.read(min(CHUNK_BYTES, limit_bytes + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)
