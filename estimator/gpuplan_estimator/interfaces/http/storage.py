"""The estimator service's storage ports (each optional: no database, no port) and the I/O
threads they run on.

Every port is a plain callable the command line builds over a `PerfStore`
(`interfaces.cli.serving`) and tests build over lists; the service never sees the database.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from gpuplan_estimator.interfaces.http import wire
from gpuplan_estimator.planning import calibrating

log = logging.getLogger(__name__)

T = TypeVar("T")

OutcomeSink = Callable[[wire.OutcomeRequest, str], tuple[int, bool]]
"""Stores a finished job's outcome (with the canonical device key); returns the row id and
whether it is new (False: this job uid was already recorded, nothing changed)."""

OutcomeHistory = Callable[[], Sequence[calibrating.Outcome]]
"""Every stored job outcome, against the model's uncalibrated estimate — `PerfStore`."""

ScalingHistory = Callable[[], Sequence[Mapping[str, Any]]]
"""Every stored job outcome as a record (`PerfStore.job_outcomes`), for the scaling fit."""

WorkloadSink = Callable[[str, bytes, str, int], None]
"""Stores a plan's compressed workload (id, bytes, device key, GPU count) once per id —
`PerfStore.add_workload`."""

WorkloadPruner = Callable[[], int]
"""Deletes plan workloads past their retention that no outcome names; returns how many."""

CoverageSource = Callable[[], Mapping[str, tuple[int, datetime | None]]]
"""Per device key: (measurement rows, end of the newest finished benchmark run) — `PerfStore`."""

BundleActivator = Callable[[int, str], int]
"""Activates a stored bundle version with a reason and returns it; raises LookupError for an
unknown version — `PerfStore.activate`."""

STORED_WORKLOAD_IDS = 4096
"""Workload ids this replica remembers as stored, so a cached plan answered again does not
write again (the store ignores a repeat anyway; this saves the round trip)."""


@dataclass(frozen=True)
class Storage:
    """The ports `make_app` was given; a None port makes its feature answer 503 or stay off."""
    outcome_sink: OutcomeSink | None = None
    coverage_source: CoverageSource | None = None
    outcome_history: OutcomeHistory | None = None
    scaling_history: ScalingHistory | None = None
    bundle_activator: BundleActivator | None = None
    workload_sink: WorkloadSink | None = None
    workload_pruner: WorkloadPruner | None = None


class IoThreads:
    """Database reads and bundle loads: I/O, bounded by their own timeouts, fine in threads."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="io")

    async def run(self, fn: Callable[[], T]) -> T:
        """`fn()` on an I/O thread; TimeoutError past `timeout_s` (a request's budget)."""
        loop = asyncio.get_running_loop()
        return await asyncio.wait_for(loop.run_in_executor(self._pool, fn),
                                      timeout=self.timeout_s)

    async def run_unbounded(self, fn: Callable[[], T]) -> T:
        """`fn()` on an I/O thread with no deadline (start-up and background work)."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)

    def shutdown(self) -> None:
        """Drop queued work; a call in progress finishes on its own."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class WorkloadKeeper:
    """Stores each plan's workload once per id through the `WorkloadSink`."""

    def __init__(self, sink: WorkloadSink | None, io: IoThreads) -> None:
        self.sink = sink
        self.io = io
        self._stored: dict[str, None] = {}  # insertion-ordered: the oldest is dropped first

    async def store(self, workload: Mapping[str, Any]) -> str | None:
        """Store the plan's workload (once per id); its id, or None when nothing is stored."""
        workload_id = workload.get("id")
        if self.sink is None or not isinstance(workload_id, str):
            if "skipped" in workload:
                log.warning("plan workload not kept: %s", workload["skipped"])
            return None
        if workload_id in self._stored:
            return workload_id
        sink = self.sink
        data = base64.b64decode(workload["zstd_b64"])
        try:
            await self.io.run(lambda: sink(workload_id, data, str(workload["device"]),
                                           int(workload["gpu_count"])))
        except Exception:  # the plan is answered all the same; only the gate loses this job
            log.exception("storing the plan's workload %s failed", workload_id[:12])
            return None
        self._stored[workload_id] = None
        while len(self._stored) > STORED_WORKLOAD_IDS:
            del self._stored[next(iter(self._stored))]
        return workload_id
