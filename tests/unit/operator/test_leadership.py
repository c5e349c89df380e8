"""Issue #33: one operator replica (the Lease holder) runs the cluster-wide loops, and a
namespaced operator lists only its namespaces' pods."""

from __future__ import annotations

import asyncio
import datetime
import functools
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gpuplan_operator import benchmark_loop, handlers, leases, metrics, modelsource, reconcile
from gpuplan_operator.core import leadership, settings

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


@pytest.mark.parametrize(("holder", "renewed_s", "now_s", "step"), [
    ("me", 0, 5, leadership.LeaseStep.RENEW),
    ("other", 0, 29, leadership.LeaseStep.FOLLOW),
    ("other", 0, 31, leadership.LeaseStep.TAKE),
    ("", 0, 1, leadership.LeaseStep.TAKE),
])
def test_the_lease_is_followed_while_live_and_taken_once_expired(
        holder: str, renewed_s: float, now_s: float, step: leadership.LeaseStep) -> None:
    lease = leadership.parse_lease(leadership.lease_body("l", "ns", holder, at(renewed_s), 30,
                                                         "7"))
    assert leadership.next_step(lease, "me", at(now_s)) is step
    assert leadership.next_step(None, "me", at(now_s)) is leadership.LeaseStep.CREATE


class FakeLeaseApi:
    """The Lease calls of `kube.Kube` over one stored object with resourceVersions, as the API
    server checks them: a replace with a stale version loses (409)."""

    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return None if self.lease is None else {**self.lease, "metadata": {
            **self.lease["metadata"], "resourceVersion": str(self.version)}}

    async def write_lease(self, namespace: str, body: dict[str, Any]) -> bool:
        wanted = body["metadata"].get("resourceVersion")
        if (self.lease is None) != (wanted is None) or (
                wanted is not None and wanted != str(self.version)):
            return False
        self.lease, self.version = body, self.version + 1
        return True


def test_two_replicas_one_leader_and_a_takeover_after_the_holder_stops() -> None:
    api = FakeLeaseApi()
    now = [T0]

    def keeper(me: str) -> leases.LeaseKeeper:
        return leases.LeaseKeeper(api, namespace="ns", name="gpuplan-operator",  # type: ignore[arg-type]
                                  me=me, duration_s=30, clock=lambda: now[0])

    a, b = keeper("a"), keeper("b")

    async def go() -> None:
        assert await a.once() and not await b.once()
        now[0] = at(20)
        assert await a.once() and not await b.once()  # renewed: b still follows
        now[0] = at(55)  # a stopped renewing at 20; 35 s later b takes over
        assert await b.once()
        assert not await a.once()  # a comes back and follows

    asyncio.run(go())


def test_a_follower_runs_no_benchmark_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    passes: list[int] = []

    async def refresh(_: Any) -> None:
        passes.append(1)

    async def stop(_: float) -> None:
        raise asyncio.CancelledError

    monkeypatch.setattr(benchmark_loop, "refresh", refresh)
    monkeypatch.setattr(benchmark_loop.asyncio, "sleep", stop)
    for leading, expected in ((False, []), (True, [1])):
        passes.clear()
        ctx = benchmark_loop.LoopContext(kube=None,  # type: ignore[arg-type]
                                         settings=settings.Settings(estimator_url="http://e:1"),
                                         metrics=None,  # type: ignore[arg-type]
                                         clock=lambda: T0, resolve=None,  # type: ignore[arg-type]
                                         leading=functools.partial(bool, leading))
        with pytest.raises(asyncio.CancelledError):
            asyncio.run(benchmark_loop.run_forever(ctx))
        assert passes == expected


@pytest.mark.parametrize(("value", "expected"), [
    ("team-a,team-b", ("team-a", "team-b")), ("", ()), ("team-*", ())])
def test_a_namespaced_operator_lists_its_own_namespaces_pods(value: str,
                                                            expected: tuple[str, ...]) -> None:
    assert handlers.pod_namespaces({"GPUPLAN_NAMESPACES": value}) == expected


class PodListings:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def list_gpu_nodes(self) -> list[dict[str, Any]]:
        return []

    async def list_active_pods(self) -> list[dict[str, Any]]:
        self.calls.append("all")
        return []

    async def list_active_pods_in(self, namespaces: tuple[str, ...]) -> list[dict[str, Any]]:
        self.calls.append(",".join(namespaces))
        return []


@pytest.mark.parametrize(("namespaces", "listed"), [((), "all"), (("team-a", "b"), "team-a,b")])
def test_the_inventory_lists_pods_where_the_operator_watches(
        namespaces: tuple[str, ...], listed: str) -> None:
    api = PodListings()
    ctx = reconcile.Context(kube=api,  # type: ignore[arg-type]
                            settings=settings.Settings(estimator_url="http://e:1"),
                            metrics=metrics.OperatorMetrics(CollectorRegistry()),
                            clock=lambda: T0, guard=modelsource.UrlGuard(),
                            pod_namespaces=namespaces)
    asyncio.run(reconcile._read_gpu_pools(ctx))
    assert api.calls == [listed]
