"""Issue #33: plans holding a model are bounded in all and per namespace, so one tenant's
thousand TrainingJobs neither exhaust the operator's memory nor queue ahead of another tenant."""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

import pytest
import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry

from gpuplan_operator import metrics, modelsource, reconcile
from gpuplan_operator.core import errors, settings, throttling
from gpuplan_testing.helm_render import ROOT
from gpuplan_testing.operator_builders import LocalServer, SpecBuilder

from .test_reconcile import CM, PLAN, FakeKube

NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
MIB = 2**20


def test_a_namespace_past_its_share_is_refused_while_others_still_queue() -> None:
    async def go() -> None:
        slots = throttling.NamespaceSlots(throttling.SlotLimits(concurrent=1, per_namespace=2))
        release = asyncio.Event()
        order: list[str] = []

        async def plan(namespace: str) -> None:
            async with slots.take(namespace):
                order.append(namespace)
                await release.wait()

        first = asyncio.create_task(plan("hostile"))
        second = asyncio.create_task(plan("hostile"))  # waits for the one slot
        await asyncio.sleep(0)
        with pytest.raises(errors.ModelFetchesBusyError, match="namespace hostile"):
            async with slots.take("hostile"):
                pass
        quiet = asyncio.create_task(plan("quiet"))
        await asyncio.sleep(0)
        assert slots.outstanding("quiet") == 1 and order == ["hostile"]
        release.set()
        await asyncio.gather(first, second, quiet)
        # The freed slot goes to the namespace served longest ago, not to the earlier waiter.
        assert order == ["hostile", "quiet", "hostile"]
        assert slots.outstanding("hostile") == 0

    asyncio.run(go())


def test_a_tenant_with_its_share_queued_does_not_keep_others_behind_all_of_it() -> None:
    async def go() -> None:
        slots = throttling.NamespaceSlots(throttling.SlotLimits(concurrent=2, per_namespace=6))
        done: list[str] = []
        gate = asyncio.Event()

        async def plan(namespace: str) -> None:
            async with slots.take(namespace):
                await gate.wait()
                done.append(namespace)

        hostile = [asyncio.create_task(plan("hostile")) for _ in range(6)]
        await asyncio.sleep(0)
        honest = [asyncio.create_task(plan(ns)) for ns in ("a", "b")]
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(*hostile, *honest)
        # Two hostile plans held both slots; both honest ones run next, ahead of the four
        # hostile plans that were queued before them.
        assert done[:2] == ["hostile", "hostile"]
        assert sorted(done[2:4]) == ["a", "b"]

    asyncio.run(go())


def test_a_waiter_cancelled_in_the_queue_gives_its_turn_away() -> None:
    async def go() -> None:
        slots = throttling.NamespaceSlots(throttling.SlotLimits(concurrent=1, per_namespace=4))
        gate = asyncio.Event()
        done: list[str] = []

        async def plan(namespace: str) -> None:
            async with slots.take(namespace):
                await gate.wait()
                done.append(namespace)

        holder = asyncio.create_task(plan("a"))
        await asyncio.sleep(0)
        doomed = asyncio.create_task(plan("b"))
        later = asyncio.create_task(plan("c"))
        await asyncio.sleep(0)
        doomed.cancel()
        await asyncio.sleep(0)
        gate.set()
        await asyncio.gather(holder, later)
        assert doomed.cancelled() and done == ["a", "c"]
        assert slots.outstanding("b") == 0

    asyncio.run(go())


@pytest.mark.parametrize(("changes", "field"), [
    ({"model_fetches": 0}, "model_fetches"),
    ({"model_fetches_per_namespace": 0}, "model_fetches_per_namespace"),
    ({"worker_limit": 2, "model_fetches": 2}, "worker_limit"),
])
def test_bad_limits_are_refused_by_name(changes: dict[str, int], field: str) -> None:
    with pytest.raises(errors.SettingsError, match=field):
        settings.Settings(estimator_url="http://e:1", **changes).validate()  # type: ignore[arg-type]


def test_the_charts_fetch_limits_keep_plans_below_the_operators_memory_limit() -> None:
    values = yaml.safe_load((ROOT / "charts/gpuplan/values.yaml").read_text())["operator"]
    limit = values["resources"]["limits"]["memory"]
    assert limit.endswith("Gi")
    held = throttling.plans_memory_bytes(values["modelFetches"]["concurrent"],
                                         values["modelUrl"]["maxBytes"])
    request = int(values["resources"]["requests"]["memory"].removesuffix("Mi")) * MIB
    # The plans in flight plus the operator's own steady state (its memory request) fit.
    assert held + request < int(limit[:-2]) * 2**30, held


def test_a_throttled_plan_writes_no_condition_and_is_retried() -> None:
    """Three TrainingJobs of one namespace at once with a share of two: the third is refused
    before fetching anything and leaves its status alone."""
    kube = FakeKube(CM)
    gate = asyncio.Event()

    async def slow_plans(_: web.Request) -> web.Response:
        await gate.wait()
        return web.json_response(PLAN)

    async def go() -> list[BaseException | None]:
        app = web.Application()
        app.router.add_post("/v1/plans", slow_plans)
        async with LocalServer(app) as srv:
            ctx = reconcile.Context(
                kube=kube,  # type: ignore[arg-type]
                settings=settings.Settings(estimator_url=srv.url, model_fetches=1,
                                           model_fetches_per_namespace=2),
                metrics=metrics.OperatorMetrics(CollectorRegistry()), clock=lambda: NOW,
                guard=modelsource.UrlGuard())

            async def one(name: str) -> None:
                tj = reconcile.TrainingJobRef("ns", name, f"uid-{name}", 1, {},
                                              lambda **_: None)
                await reconcile.reconcile(ctx, tj, SpecBuilder().obj())

            tasks = [asyncio.create_task(one(n)) for n in ("a", "b")]
            await asyncio.sleep(0.2)
            third: Any = None
            try:
                await one("c")
            except errors.ModelFetchesBusyError as exc:
                third = exc
            gate.set()
            await asyncio.gather(*tasks)
            return [third]

    (third,) = asyncio.run(go())
    assert isinstance(third, errors.ModelFetchesBusyError)
    assert not [c for c in kube.calls if "status" in c and "plan" not in c
                and "jobName" not in c], kube.calls
