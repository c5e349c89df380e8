"""The fair queue in front of the estimation workers (pure asyncio, no server)."""

from __future__ import annotations

import asyncio

import pytest

from gpuplan_estimator.interfaces.http import admission


def gate(workers: int = 2, per_client: int | None = None, queued: int = 8,
         total: int = 64) -> admission.Admission:
    return admission.Admission(admission.AdmissionSettings(
        workers, per_client or workers, queued, total))


async def hold(g: admission.Admission, client: str, order: list[str],
               release: asyncio.Event) -> None:
    async with g.slot(client):
        order.append(client)
        await release.wait()


def test_a_busy_client_leaves_one_worker_spare_for_a_newcomer() -> None:
    async def go() -> list[str]:
        g, order, release = gate(workers=3), [], asyncio.Event()
        tasks = [asyncio.create_task(hold(g, "a", order, release)) for _ in range(4)]
        await asyncio.sleep(0.01)
        assert order == ["a", "a"] and g.running("a") == 2  # the third worker stays spare
        tasks.append(asyncio.create_task(hold(g, "b", order, release)))
        await asyncio.sleep(0.01)
        assert order == ["a", "a", "b"]  # b takes it at once, though a waited first
        release.set()
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(go()) == ["a", "a", "b", "a", "a"]


def test_a_freed_worker_goes_to_the_waiting_client_running_fewest() -> None:
    async def go() -> list[str]:
        g, order = gate(workers=4), []
        early, rest = asyncio.Event(), asyncio.Event()
        tasks = [asyncio.create_task(hold(g, "a", order, ev)) for ev in (early, rest, rest)]
        await asyncio.sleep(0.01)
        tasks.append(asyncio.create_task(hold(g, "a", order, rest)))  # waits: one spare
        await asyncio.sleep(0.01)
        tasks += [asyncio.create_task(hold(g, c, order, rest)) for c in ("b", "b", "c")]
        await asyncio.sleep(0.01)
        assert order == ["a", "a", "a", "b"]  # b took the spare; b's second and c wait
        early.set()  # one of a's ends: c (nothing running) goes before a and b (one each)
        await asyncio.sleep(0.01)
        assert order == ["a", "a", "a", "b", "c"]
        rest.set()
        await asyncio.gather(*tasks)
        return order

    assert sorted(asyncio.run(go())) == ["a"] * 4 + ["b"] * 2 + ["c"]


def test_queue_caps_refuse_instead_of_queueing() -> None:
    async def go() -> None:
        g, order, release = gate(workers=1, queued=1, total=2), [], asyncio.Event()
        first = asyncio.create_task(hold(g, "a", order, release))
        waiting = asyncio.create_task(hold(g, "a", order, release))
        await asyncio.sleep(0.01)
        with pytest.raises(admission.Busy, match="this client"):
            async with g.slot("a"):
                pass
        other = asyncio.create_task(hold(g, "b", order, release))
        await asyncio.sleep(0.01)
        with pytest.raises(admission.Busy, match="the service"):
            async with g.slot("c"):
                pass
        release.set()
        await asyncio.gather(first, waiting, other)

    asyncio.run(go())


def test_a_waiter_cancelled_as_its_slot_frees_leaves_no_trace() -> None:
    """Found by `make abuse`: a grant to a waiter cancelled in the same loop turn (its deadline)
    raised InvalidStateError, and both requests answered 500."""
    async def go() -> None:
        g, order, release = gate(workers=1), [], asyncio.Event()
        first = asyncio.create_task(hold(g, "a", order, release))
        await asyncio.sleep(0.01)
        gone = asyncio.create_task(hold(g, "b", order, release))
        late = asyncio.create_task(hold(g, "c", order, release))
        await asyncio.sleep(0.01)
        gone.cancel()  # cancelled, but its task has not run yet when the slot frees
        release.set()
        await asyncio.gather(first, late)
        assert order == ["a", "c"]
        assert g.running("a") == g.running("b") == g.running("c") == 0
        async with g.slot("d"):  # nothing leaked: a new client starts at once
            assert g.running("d") == 1

    asyncio.run(go())


def test_a_per_client_cap_applies_below_the_spare_rule() -> None:
    async def go() -> None:
        g, order, release = gate(workers=4, per_client=1), [], asyncio.Event()
        tasks = [asyncio.create_task(hold(g, "a", order, release)) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert order == ["a"] and g.running("a") == 1  # the spare rule alone would allow 3
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(go())
