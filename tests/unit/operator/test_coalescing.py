"""Shared reads: concurrent plans list nodes and pods once, not once each."""

from __future__ import annotations

import asyncio

import pytest

from gpuplan_operator.core import coalescing


def test_concurrent_callers_share_one_read_and_a_fresh_value_is_reused() -> None:
    now = [100.0]
    reads: list[int] = []
    shared: coalescing.Coalesced[int] = coalescing.Coalesced(1.0, clock=lambda: now[0])

    async def read() -> int:
        reads.append(len(reads))
        await asyncio.sleep(0.05)
        return len(reads)

    async def go() -> list[int]:
        first = await asyncio.gather(*(shared.get(read) for _ in range(50)))
        now[0] += 0.5
        again = await shared.get(read)
        now[0] += 0.6  # older than max_age: read afresh
        return [*first, again, await shared.get(read)]

    values = asyncio.run(go())
    assert values == [1] * 51 + [2]
    assert len(reads) == 2


def test_a_failed_read_fails_its_waiters_and_the_next_call_reads_again() -> None:
    shared: coalescing.Coalesced[str] = coalescing.Coalesced(10.0, clock=lambda: 0.0)
    outcomes = iter([RuntimeError("api down"), "ok"])

    async def read() -> str:
        await asyncio.sleep(0.01)
        outcome = next(outcomes)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    async def go() -> str:
        results = await asyncio.gather(shared.get(read), shared.get(read),
                                       return_exceptions=True)
        assert [type(r) for r in results] == [RuntimeError, RuntimeError]
        return await shared.get(read)

    assert asyncio.run(go()) == "ok"


def test_values_by_key_are_separate_and_old_keys_are_dropped() -> None:
    now = [0.0]
    by_key: coalescing.CoalescedByKey[str, str] = coalescing.CoalescedByKey(
        1.0, clock=lambda: now[0])

    async def value(text: str) -> str:
        return text

    async def go() -> None:
        assert await by_key.get("a", lambda: value("A")) == "A"
        assert await by_key.get("b", lambda: value("B")) == "B"
        assert await by_key.get("a", lambda: value("changed")) == "A"  # fresh: shared
        assert len(by_key) == 2
        now[0] += 2.0
        assert await by_key.get("a", lambda: value("A2")) == "A2"
        assert len(by_key) == 1  # "b" was older than max_age and is gone

    asyncio.run(go())


@pytest.mark.parametrize("max_age_s", [0.0])
def test_a_zero_max_age_still_shares_a_read_in_flight(max_age_s: float) -> None:
    reads: list[None] = []
    shared: coalescing.Coalesced[int] = coalescing.Coalesced(max_age_s)

    async def read() -> int:
        reads.append(None)
        await asyncio.sleep(0.05)
        return 1

    async def go() -> None:
        await asyncio.gather(shared.get(read), shared.get(read))
        await shared.get(read)

    asyncio.run(go())
    assert len(reads) == 2
