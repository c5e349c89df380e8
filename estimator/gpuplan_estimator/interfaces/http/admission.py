"""Who may use a worker next: a per-client cap on running work and on waiting requests.

The workers are few (estimating is CPU-bound), so one tenant submitting a hundred large models
must not hold them all. Each client may run at most `running_per_client` requests at once and
queue `queued_per_client` more; beyond that it gets 429. Waiting counts against the request's
own deadline. The client is the peer address together with the optional client header, so a
caller can split its own share among its tenants; all waiting requests together are capped too,
so inventing header values cannot queue without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

CLIENT_HEADER = "X-Gpuplan-Client"
"""Optional: who the request is for (the operator sends the TrainingJob's namespace), so
tenants behind one caller share it fairly."""
MAX_CLIENT_KEY_CHARS = 128


class Busy(Exception):
    """The client already has as many requests waiting as it may."""


@dataclass(frozen=True)
class AdmissionSettings:
    """Per-client limits."""
    running_per_client: int
    queued_per_client: int
    queued_total: int


@dataclass
class _Client:
    running: asyncio.Semaphore
    waiting: int = 0
    holders: int = 0


@dataclass
class Admission:
    """Per-client semaphores; a client's entry is dropped when it has nothing in flight."""
    settings: AdmissionSettings
    _clients: dict[str, _Client] = field(default_factory=dict)

    @contextlib.asynccontextmanager
    async def slot(self, client: str) -> AsyncIterator[None]:
        """Hold one of `client`'s running slots; Busy when its queue is full."""
        entry = self._clients.get(client)
        if entry is None:
            entry = _Client(asyncio.Semaphore(self.settings.running_per_client))
            self._clients[client] = entry
        if entry.running.locked():
            if entry.waiting >= self.settings.queued_per_client:
                raise Busy(f"this client already has {entry.waiting} requests waiting")
            if self._waiting_total() >= self.settings.queued_total:
                raise Busy("the service has as many requests waiting as it queues")
        entry.holders += 1
        entry.waiting += 1
        try:
            await entry.running.acquire()
        except BaseException:
            entry.waiting -= 1
            self._release(client, entry, held=False)
            raise
        entry.waiting -= 1
        try:
            yield
        finally:
            self._release(client, entry, held=True)

    def _release(self, client: str, entry: _Client, *, held: bool) -> None:
        if held:
            entry.running.release()
        entry.holders -= 1
        if entry.holders == 0:
            del self._clients[client]

    def _waiting_total(self) -> int:
        return sum(c.waiting for c in self._clients.values())

    def clients(self) -> int:
        """Clients with work running or waiting."""
        return len(self._clients)


def client_key(header: str | None, peer: str | None) -> str:
    """The admission key of a request: its peer address and client header."""
    return f"{peer or 'unknown'}/{(header or '')[:MAX_CLIENT_KEY_CHARS]}"
