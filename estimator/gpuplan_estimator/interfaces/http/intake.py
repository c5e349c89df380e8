"""Admission of a request body before it is read (issue #33): bytes held per client and in all.

`Front` queues requests whose bodies are already in memory, so without this a client could park
`queued_per_client` bodies of `max_body_bytes` each (64 x 64 MiB = 4 GiB, the pod's limit) before
its queue said no. Here a plan or estimate reserves its declared `Content-Length` (a body sent
without one reserves the cap) against its client's byte budget and the service's, and only then
is read; the reservation lasts until the answer is sent. Refused requests are never read.

Worst case of the estimator pod's memory that one client can cause (`worst_case_bytes`, checked
against the chart's defaults in the tests): the main process's own use, the bodies this client
may hold, the reply cache, and the workers this client may run at their `RLIMIT_DATA` cap while
the others idle with the bundle loaded.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from gpuplan_estimator.interfaces.http import admission

MAIN_PROCESS_BYTES = 512 * 2**20
"""Resident size allowed for the service process itself (aiohttp, the loaded bundle, the
calibration): the budget's assumption, not a measurement; see docs/security.md#memory."""
IDLE_WORKER_BYTES = 320 * 2**20
"""A worker holding only the bundle (the chart's "~250 MiB" plus the interpreter)."""


class TooLarge(Exception):
    """The declared body exceeds the service's body cap (answered 413 without reading it)."""


@dataclass(frozen=True)
class IntakeSettings:
    """Body caps: one body, one client's bodies held at once, all clients' together."""
    max_body_bytes: int
    bytes_per_client: int
    bytes_total: int

    def problems(self) -> list[str]:
        """Every inconsistent field, named as its command-line option."""
        out: list[str] = []
        if self.bytes_per_client < self.max_body_bytes:
            out.append(f"--body-bytes-per-client ({self.bytes_per_client}) must be at least "
                       f"--max-body-bytes ({self.max_body_bytes})")
        if self.bytes_total < self.bytes_per_client:
            out.append(f"--body-bytes-total ({self.bytes_total}) must be at least "
                       f"--body-bytes-per-client ({self.bytes_per_client})")
        return out


@dataclass
class Intake:
    """Reserves body bytes per client before a body is read; `hold` for one request."""
    settings: IntakeSettings
    _held: collections.Counter[str] = field(default_factory=collections.Counter)

    @contextlib.contextmanager
    def hold(self, client: str, content_length: int | None) -> Iterator[int]:
        """Reserve the body's bytes for `client` while the request is answered; yields the
        bytes reserved. TooLarge (413) past the body cap, `admission.Busy` (429) past the
        client's or the service's budget."""
        cap = self.settings.max_body_bytes
        if content_length is not None and content_length > cap:
            raise TooLarge(f"body exceeds {cap} bytes")
        wanted = cap if content_length is None else content_length
        if self._held[client] + wanted > self.settings.bytes_per_client:
            raise admission.Busy(f"this client already has {self._held[client]} bytes of "
                                 "requests in progress; retry when they are answered")
        if self.total() + wanted > self.settings.bytes_total:
            raise admission.Busy("the service holds as many request bytes as it admits")
        self._held[client] += wanted
        try:
            yield wanted
        finally:
            self._held[client] -= wanted
            if self._held[client] <= 0:
                del self._held[client]

    def held(self, client: str) -> int:
        """Bytes reserved by `client` now."""
        return self._held[client]

    def total(self) -> int:
        """Bytes reserved by every client now."""
        return sum(self._held.values())


@dataclass(frozen=True)
class MemoryPlan:
    """What bounds the estimator pod's memory: the settings that size each part."""
    workers: int
    running_per_client: int
    worker_memory_bytes: int
    bytes_per_client: int
    bytes_total: int
    cache_bytes: int


def client_worst_case_bytes(plan: MemoryPlan) -> int:
    """The most memory one client can make the pod use: its bodies, the reply cache (which it
    may fill alone), the workers it may run at their cap and the others idle. A running body is
    also copied once into its worker, inside the worker's cap."""
    running = min(plan.running_per_client, max(plan.workers - 1, 1))
    return (MAIN_PROCESS_BYTES + plan.bytes_per_client + plan.cache_bytes
            + running * plan.worker_memory_bytes
            + (plan.workers - running) * IDLE_WORKER_BYTES)


def total_worst_case_bytes(plan: MemoryPlan) -> int:
    """The same for every client together: all bodies, every worker at its cap."""
    return (MAIN_PROCESS_BYTES + plan.bytes_total + plan.cache_bytes
            + plan.workers * plan.worker_memory_bytes)
