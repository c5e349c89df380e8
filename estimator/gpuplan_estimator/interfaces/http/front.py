"""In front of the estimation workers: the answer cache, shared computations, the fair queue
and the deadline. The service's plan and estimate handlers are one call into `Front.answer`."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from gpuplan_estimator.interfaces.http import admission, caching, work, workers
from gpuplan_estimator.interfaces.http.metrics import Metrics
from gpuplan_estimator.parallel import scaling
from gpuplan_estimator.planning import calibrating

LARGE_BODY_BYTES = 1 << 20
"""Bodies above this are hashed off the event loop."""


@dataclass(frozen=True)
class Ask:
    """One plan or estimate request as the front sees it."""
    endpoint: str
    body: bytes
    bundle: str
    """The service's bundle version (`predictor_source`); workers follow it."""
    calibration: calibrating.CalibrationTable
    calibration_generation: int
    """Counts swaps of the calibration and of the scaling model (both key the cache)."""
    client: str
    deadline: float
    """Event-loop time by which the answer must be given."""
    scaling_fit: scaling.FittedScaling | None = None
    """The service's multi-GPU scaling fit (fitted or analytic); None: the context's own."""


class Front:
    """Cache → shared computation → fair queue → worker, under the request's deadline."""

    def __init__(self, pool: workers.WorkerPool, gate: admission.Admission,
                 cache: caching.ReplyCache, metrics: Metrics, timeout_s: float) -> None:
        self.pool = pool
        self._gate = gate
        self._cache = cache
        self._metrics = metrics
        self._timeout_s = timeout_s
        self._in_flight: dict[str, asyncio.Task[caching.EncodedReply]] = {}

    async def answer(self, ask: Ask) -> caching.EncodedReply:
        """The answer to `ask`: cached, shared with an identical request in flight, or computed.
        Shielded: a client that goes away does not cancel what others wait for (the
        computation still ends at its own deadline)."""
        def key_of() -> str:
            return caching.request_key(ask.endpoint, ask.body, ask.bundle,
                                       ask.calibration_generation)
        key = key_of() if len(ask.body) < LARGE_BODY_BYTES else await asyncio.to_thread(key_of)
        found = self._cache.get(key)
        source = "cache"
        if found is None:
            task = self._in_flight.get(key)
            source = "shared"
            if task is None:
                source = "computed"
                task = asyncio.create_task(self._compute(ask))
                self._in_flight[key] = task
                task.add_done_callback(lambda done: self._settle(key, done))
            found = await asyncio.shield(task)
        self._metrics.answers.labels(source).inc()
        return found

    async def _compute(self, ask: Ask) -> caching.EncodedReply:
        ran = False
        try:
            async with asyncio.timeout_at(ask.deadline), self._gate.slot(ask.client):
                ran = True
                remaining = ask.deadline - asyncio.get_running_loop().time()
                reply = await self.pool.run(ask.endpoint, ask.body, ask.bundle,
                                            ask.calibration, remaining, ask.scaling_fit)
        except admission.Busy as exc:
            reply = work.error_reply(429, "TooManyRequests", str(exc))
        except (TimeoutError, workers.WorkTimeout):
            if ran:  # only a timeout of the work itself says something about the model
                self._metrics.worker_timeouts.inc()
                reply = work.error_reply(504, "Timeout", f"estimation exceeded the request's "
                                         f"{self._timeout_s:g} s")
            else:
                reply = work.error_reply(503, "Busy", f"no worker was free within the "
                                         f"request's {self._timeout_s:g} s")
        return caching.EncodedReply(reply.status, json.dumps(reply.body).encode())

    def _settle(self, key: str, done: asyncio.Task[caching.EncodedReply]) -> None:
        self._in_flight.pop(key, None)
        if not done.cancelled() and done.exception() is None:
            self._cache.put(key, done.result())

    def close(self) -> None:
        """Cancel what is in flight and stop the workers."""
        for pending in list(self._in_flight.values()):
            pending.cancel()
        self.pool.close()
