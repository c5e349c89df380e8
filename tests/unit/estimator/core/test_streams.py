"""`read_capped` reads a body to its end, however it arrives, and stops past its cap."""

from __future__ import annotations

import asyncio

from gpuplan_estimator.core import streams


class Trickle:
    """A body that arrives `step` bytes per read, as a loaded connection delivers it."""

    def __init__(self, body: bytes, step: int) -> None:
        self.body, self.step, self.reads = body, step, 0

    async def read(self, n: int = -1) -> bytes:
        self.reads += 1
        chunk = self.body[: min(self.step, n if n >= 0 else len(self.body))]
        self.body = self.body[len(chunk):]
        return chunk


def test_a_body_arriving_in_pieces_is_read_whole() -> None:
    body = b'{"status": {"authenticated": true, "user": {"username": "' + b"x" * 700 + b'"}}}'
    stream = Trickle(body, 300)
    assert asyncio.run(streams.read_capped(stream, 1 << 20)) == body
    assert stream.reads > 3  # one read would have held its first 300 bytes


def test_a_body_past_the_cap_comes_back_one_byte_longer_and_no_more() -> None:
    stream = Trickle(b"y" * 10_000, 999)
    raw = asyncio.run(streams.read_capped(stream, 2_500))
    assert raw == b"y" * 2_501
    assert asyncio.run(streams.read_capped(Trickle(b"", 10), 5)) == b""
