"""Worker processes for estimation, each killable at its request's deadline (pebble).

A thread cannot be stopped, so a timed-out estimate in a thread pool keeps its CPU and memory
and starves the requests behind it. A pebble `ProcessPool` task that passes its timeout, or
whose client went away, has its worker process terminated; the pool starts a fresh one.

Workers come from a forkserver, not `fork`: the service has loaded LightGBM bundles, and an
OpenMP runtime that has run in the parent hangs in a forked child.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import multiprocessing
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass

import pebble

from gpuplan_estimator.interfaces.http import work
from gpuplan_estimator.parallel import scaling
from gpuplan_estimator.planning import calibrating

PRELOAD = ["gpuplan_estimator.interfaces.http.work"]
"""Imported once by the forkserver, so a new worker starts in a fork, not a fresh interpreter."""


class WorkTimeout(Exception):
    """The worker ran past the deadline and was killed."""


@dataclass(frozen=True)
class PoolSettings:
    """Size and recycling of the estimation worker pool."""
    workers: int
    tasks_per_worker: int
    """A worker is replaced after this many tasks, so memory a model left behind is returned."""
    memory_bytes: int
    """Data segment a worker may grow to, its model bundle included (`RLIMIT_DATA`)."""


class WorkerPool:
    """Runs `work.handle` in worker processes; `run` awaits one task under a deadline."""

    def __init__(self, loader: work.ContextLoader, settings: PoolSettings) -> None:
        self._loader = loader
        self._settings = settings
        self._pool = self._start()

    def _start(self) -> pebble.ProcessPool:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(PRELOAD)
        return pebble.ProcessPool(
            max_workers=self._settings.workers, max_tasks=self._settings.tasks_per_worker,
            initializer=work.init_worker,
            initargs=(self._loader, self._settings.memory_bytes), context=context)

    async def run(self, endpoint: str, body: bytes, source: str,
                  calibration: calibrating.CalibrationTable, timeout_s: float,
                  scaling_fit: scaling.FittedScaling | None = None) -> work.Reply:
        """One request in a worker; WorkTimeout past `timeout_s`. Cancelling the awaiting
        task (the client went away) terminates the worker too."""
        future = self._pool.schedule(work.handle,
                                     args=(endpoint, body, source, calibration, scaling_fit),
                                     timeout=timeout_s)
        try:
            return await asyncio.wrap_future(future)
        except concurrent.futures.TimeoutError:
            raise WorkTimeout(f"estimation exceeded {timeout_s:.1f} s") from None
        except BrokenProcessPool:
            # Every worker died at start (the bundle would not load in them): start afresh
            # for the next request rather than refuse them all from now on.
            self._pool.stop()
            self._pool = self._start()
            return work.error_reply(503, "WorkersUnavailable", "the estimation workers failed "
                                    "to start; see the service log")
        except pebble.ProcessExpired as exc:
            # Killed from outside (OOM killer, segfault in a native library on this graph).
            return work.error_reply(422, "InvalidModel", f"estimating this model ended its "
                                    f"worker process (exit code {exc.exitcode})")
        finally:
            future.cancel()  # no-op once done; stops the worker when we stopped waiting

    async def warm_up(self, timeout_s: float) -> None:
        """Wait until the workers have built their contexts, so the first requests do not pay
        for the forkserver's imports and the bundle load inside their own deadline."""
        futures = [asyncio.wrap_future(self._pool.schedule(work.ready, timeout=timeout_s))
                   for _ in range(self._settings.workers)]
        await asyncio.gather(*futures)

    def close(self) -> None:
        """Stop every worker now; tasks in flight are abandoned."""
        self._pool.stop()
        self._pool.join(timeout=10)
