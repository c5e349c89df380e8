"""How many TrainingJob plans may hold a model in memory at once, and how many one namespace
may have started or waiting (issue #33).

A plan in flight holds its model about four times over (the fetched bytes, a decompressed copy,
the base64 request body and its encoding), so 64 MiB models cost ~256 MiB each against the
operator's 1 GiB limit. `NamespaceSlots` runs at most `concurrent` plans (the rest wait, holding
nothing) and refuses a namespace's plan outright while that namespace already has
`per_namespace` plans running or waiting: its TrainingJob is retried later by kopf, so a tenant
with a thousand TrainingJobs occupies neither the operator's memory nor all of kopf's workers.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
from collections.abc import AsyncIterator
from dataclasses import dataclass

from gpuplan_operator.core import errors

IN_FLIGHT_COPIES = 4
"""Copies of a model a plan in flight holds (bytes, decompressed, base64 body, its encoding)."""


def plans_memory_bytes(concurrent: int, model_max_bytes: int) -> int:
    """The most memory plans in flight can hold: `concurrent` models of the largest size."""
    return concurrent * IN_FLIGHT_COPIES * model_max_bytes


@dataclass(frozen=True)
class SlotLimits:
    """Plans holding a model at once, and plans one namespace may have running or waiting."""
    concurrent: int
    per_namespace: int


class NamespaceSlots:
    """A semaphore of `concurrent` slots shared fairly by namespaces, with a cap on each
    namespace's plans running or waiting.

    When a slot frees it goes to the waiting namespace with the fewest plans running, then the
    one served longest ago, then the earliest waiter: a tenant with its share queued cannot keep
    another tenant's plan behind all of it (FIFO did, up to `per_namespace` plans)."""

    def __init__(self, limits: SlotLimits) -> None:
        self.limits = limits
        self._free = limits.concurrent
        self._outstanding: collections.Counter[str] = collections.Counter()
        self._running: collections.Counter[str] = collections.Counter()
        self._waiting: dict[str, collections.deque[tuple[int, asyncio.Future[None]]]] = {}
        self._last_granted: dict[str, int] = {}
        self._tick = itertools.count()

    @contextlib.asynccontextmanager
    async def take(self, namespace: str) -> AsyncIterator[None]:
        """Hold a slot for a plan of `namespace`; ModelFetchesBusyError when the namespace
        already has its share running or waiting."""
        if self._outstanding[namespace] >= self.limits.per_namespace:
            raise errors.ModelFetchesBusyError(
                f"namespace {namespace} already has {self._outstanding[namespace]} TrainingJob "
                f"plans fetching or waiting to fetch their models (at most "
                f"{self.limits.per_namespace}); retrying later")
        self._outstanding[namespace] += 1
        try:
            await self._acquire(namespace)
            try:
                yield
            finally:
                self._release(namespace)
        finally:
            self._outstanding[namespace] -= 1
            if self._outstanding[namespace] <= 0:
                del self._outstanding[namespace]
                self._last_granted.pop(namespace, None)

    def outstanding(self, namespace: str) -> int:
        """Plans of `namespace` running or waiting now."""
        return self._outstanding[namespace]

    async def _acquire(self, namespace: str) -> None:
        if self._free > 0 and not self._waiting:
            self._grant_to(namespace)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (next(self._tick), granted)
        self._waiting.setdefault(namespace, collections.deque()).append(entry)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():  # granted, then cancelled
                self._release(namespace)
            else:
                self._forget(namespace, entry)
            raise

    def _release(self, namespace: str) -> None:
        self._running[namespace] -= 1
        if self._running[namespace] <= 0:
            del self._running[namespace]
        self._free += 1
        while self._free > 0 and self._waiting:
            chosen = min(self._waiting, key=self._turn)
            _, granted = self._waiting[chosen].popleft()
            if not self._waiting[chosen]:
                del self._waiting[chosen]
            if granted.done():  # its task was cancelled while waiting: nothing to hand over
                continue
            self._grant_to(chosen)
            granted.set_result(None)

    def _turn(self, namespace: str) -> tuple[int, int, int]:
        """Who is served next: fewest running, served longest ago, earliest waiter."""
        return (self._running[namespace], self._last_granted.get(namespace, -1),
                self._waiting[namespace][0][0])

    def _grant_to(self, namespace: str) -> None:
        self._free -= 1
        self._running[namespace] += 1
        self._last_granted[namespace] = next(self._tick)

    def _forget(self, namespace: str, entry: tuple[int, asyncio.Future[None]]) -> None:
        queue = self._waiting.get(namespace)
        if queue is not None and entry in queue:
            queue.remove(entry)
            if not queue:
                del self._waiting[namespace]
