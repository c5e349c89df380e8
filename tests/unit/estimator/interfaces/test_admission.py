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


def test_a_lone_client_uses_every_worker_and_freed_slots_go_to_whoever_runs_fewest() -> None:
    async def go() -> list[str]:
        g, order, release = gate(), [], asyncio.Event()
        tasks = [asyncio.create_task(hold(g, c, order, release)) for c in ("a", "a", "a", "a")]
        await asyncio.sleep(0.01)
        assert order == ["a", "a"] and g.running("a") == 2
        tasks.append(asyncio.create_task(hold(g, "b", order, release)))
        await asyncio.sleep(0.01)
        release.set()  # both of a's finish; b (0 running) is served before a's third
        await asyncio.gather(*tasks)
        return order

    assert asyncio.run(go())[:3] == ["a", "a", "b"]


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


def test_a_cancelled_waiter_leaves_no_trace_and_a_granted_one_passes_its_slot_on() -> None:
    async def go() -> None:
        g, order, release = gate(workers=1), [], asyncio.Event()
        first = asyncio.create_task(hold(g, "a", order, release))
        await asyncio.sleep(0.01)
        gone = asyncio.create_task(hold(g, "b", order, release))
        late = asyncio.create_task(hold(g, "c", order, release))
        await asyncio.sleep(0.01)
        gone.cancel()
        release.set()
        await asyncio.gather(first, late)
        assert order == ["a", "c"]
        assert g.running("a") == g.running("b") == g.running("c") == 0
        async with g.slot("d"):  # nothing leaked: a new client starts at once
            assert g.running("d") == 1

    asyncio.run(go())


def test_a_per_client_cap_keeps_a_worker_free_for_others() -> None:
    async def go() -> None:
        g, order, release = gate(workers=2, per_client=1), [], asyncio.Event()
        tasks = [asyncio.create_task(hold(g, "a", order, release)) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert order == ["a"]
        tasks.append(asyncio.create_task(hold(g, "b", order, release)))
        await asyncio.sleep(0.01)
        assert order == ["a", "b"]  # b starts at once though a was waiting first
        release.set()
        await asyncio.gather(*tasks)

    asyncio.run(go())
