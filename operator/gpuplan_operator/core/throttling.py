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
    """A FIFO semaphore over all namespaces with a cap on each namespace's share of it."""

    def __init__(self, limits: SlotLimits) -> None:
        self.limits = limits
        self._running = asyncio.Semaphore(limits.concurrent)
        self._outstanding: collections.Counter[str] = collections.Counter()

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
            async with self._running:
                yield
        finally:
            self._outstanding[namespace] -= 1
            if self._outstanding[namespace] <= 0:
                del self._outstanding[namespace]

    def outstanding(self, namespace: str) -> int:
        """Plans of `namespace` running or waiting now."""
        return self._outstanding[namespace]
