"""One API read shared by every reconcile that needs it at about the same time.

Fifty TrainingJobs applied together each need the cluster's GPU nodes and active pods; listing
them fifty times loads the API server and makes every plan wait behind the others' lists. A
`Coalesced` value is read once and served to all callers that ask while the read runs or
within `max_age_s` after it: the plan's inventory is at most that stale, and the scheduler
extender, which places the pods, reads its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class Coalesced(Generic[T]):
    """A value re-read at most once per `max_age_s`, with concurrent readers sharing a read."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age_s = max_age_s
        self._clock = clock
        self._value: T | None = None
        self._read_at = 0.0
        self._reading: asyncio.Task[T] | None = None

    async def get(self, read: Callable[[], Awaitable[T]]) -> T:
        """The value read less than `max_age_s` ago, else the result of one shared `read`.
        A failed read fails everyone who waited on it and is tried afresh by the next call."""
        if self._value is not None and self._clock() - self._read_at < self._max_age_s:
            return self._value
        if self._reading is None:
            self._reading = asyncio.create_task(self._refresh(read))
        return await asyncio.shield(self._reading)

    @property
    def reading(self) -> bool:
        """Whether a read is in flight."""
        return self._reading is not None

    async def _refresh(self, read: Callable[[], Awaitable[T]]) -> T:
        try:
            value = await read()
        finally:
            self._reading = None
        self._value, self._read_at = value, self._clock()
        return value


K = TypeVar("K")


class CoalescedByKey(Generic[K, T]):
    """`Coalesced` values by key (e.g. one ConfigMap per namespace and name); entries older
    than `max_age_s` are dropped, so the map holds only what was read in the last moment."""

    def __init__(self, max_age_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._max_age_s = max_age_s
        self._clock = clock
        self._entries: dict[K, tuple[float, Coalesced[T]]] = {}

    async def get(self, key: K, read: Callable[[], Awaitable[T]]) -> T:
        """The value of `key`, shared as `Coalesced.get` shares it."""
        now = self._clock()
        for stale in [k for k, (at, c) in self._entries.items()
                      if now - at >= self._max_age_s and not c.reading]:
            del self._entries[stale]
        entry = self._entries.get(key)
        if entry is None:
            entry = (now, Coalesced(self._max_age_s, self._clock))
            self._entries[key] = entry
        return await entry[1].get(read)

    def __len__(self) -> int:
        return len(self._entries)
