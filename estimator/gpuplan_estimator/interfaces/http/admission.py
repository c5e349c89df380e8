"""Who gets the next estimation worker: a fair queue per client, with a worker kept spare.

The workers are few (estimating is CPU-bound) and an estimate may run for its whole deadline.
A client with nothing running may always take a free worker; a client already running may take
another only while one more stays free for newcomers. So however many large models one tenant
submits, another tenant's request finds a worker (the issue's "two large models filled the pool
and the next five small requests all timed out"), and a lone tenant still uses all workers but
one. When a worker frees up, it goes to the waiting client with the fewest requests running
(the longest-waiting one among equals).

A client may queue only `queued_per_client` requests, and all clients together `queued_total`;
beyond that the request gets 429. Waiting counts against the request's own deadline.

The client is the peer address together with the optional client header: a caller can split
its own share among its tenants, and inventing header values cannot queue without bound.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

CLIENT_HEADER = "X-Gpuplan-Client"
"""Optional: who the request is for (the operator sends the TrainingJob's namespace), so
tenants behind one caller share it fairly."""
MAX_CLIENT_KEY_CHARS = 128


class Busy(Exception):
    """The client, or the service, already has as many requests waiting as it queues."""


@dataclass(frozen=True)
class AdmissionSettings:
    """Worker count and queue limits."""
    workers: int
    running_per_client: int
    """Hard cap per client, below what the spare-worker rule allows (`workers` for none)."""
    queued_per_client: int
    queued_total: int


@dataclass
class Admission:
    """Grants worker slots; `slot(client)` holds one for the duration of a request."""
    settings: AdmissionSettings
    _running: collections.Counter[str] = field(default_factory=collections.Counter)
    _waiting: dict[str, collections.deque[asyncio.Future[None]]] = field(default_factory=dict)
    _arrivals: collections.Counter[str] = field(default_factory=collections.Counter)
    _tick: int = 0

    @contextlib.asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[None]:
        """Hold a worker slot for `client`; Busy when its queue (or the service's) is full."""
        if self._may_start(client) and not self._waiting:
            self._running[client] += 1
        else:
            await self._wait(client)
        try:
            yield
        finally:
            self._release(client)

    def running(self, client: str) -> int:
        """Requests of `client` holding a slot now."""
        return self._running[client]

    def _may_start(self, client: str) -> bool:
        free = self.settings.workers - sum(self._running.values())
        mine = self._running[client]
        spare = 1 if self.settings.workers > 1 and mine > 0 else 0
        return free > spare and mine < self.settings.running_per_client

    async def _wait(self, client: str) -> None:
        queue = self._waiting.get(client)
        if queue is not None and len(queue) >= self.settings.queued_per_client:
            raise Busy(f"this client already has {len(queue)} requests waiting")
        if sum(len(q) for q in self._waiting.values()) >= self.settings.queued_total:
            raise Busy("the service has as many requests waiting as it queues")
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if queue is None:
            queue = self._waiting[client] = collections.deque()
            self._tick += 1
            self._arrivals[client] = self._tick
        queue.append(granted)
        self._grant()  # a slot may be free that only per-client caps kept from the others
        try:
            await granted
        except BaseException:
            if granted.done() and not granted.cancelled():
                self._release(client)  # granted as we were cancelled: pass it on
            else:
                self._forget(client, granted)
            raise

    def _forget(self, client: str, granted: asyncio.Future[None]) -> None:
        queue = self._waiting.get(client)
        if queue is not None and granted in queue:
            queue.remove(granted)
            if not queue:
                del self._waiting[client]
                del self._arrivals[client]

    def _release(self, client: str) -> None:
        self._running[client] -= 1
        if self._running[client] <= 0:
            del self._running[client]
        self._grant()

    def _grant(self) -> None:
        """Give free slots to the waiting clients with the fewest running, oldest first."""
        while self._waiting:
            eligible = [c for c in self._waiting if self._may_start(c)]
            if not eligible:
                return
            client = min(eligible, key=lambda c: (self._running[c], self._arrivals[c]))
            queue = self._waiting[client]
            granted = queue.popleft()
            if not queue:
                del self._waiting[client]
                del self._arrivals[client]
            else:  # the rest of its queue goes to the back of the line among equals
                self._tick += 1
                self._arrivals[client] = self._tick
            if granted.done():  # its waiter was cancelled (deadline) before it could leave
                continue
            self._running[client] += 1
            granted.set_result(None)


def client_key(header: str | None, peer: str | None) -> str:
    """The admission key of a request: its peer address and client header."""
    return f"{peer or 'unknown'}/{(header or '')[:MAX_CLIENT_KEY_CHARS]}"
