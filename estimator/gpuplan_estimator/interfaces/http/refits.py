"""The estimator service's refits: the calibration and the multi-GPU scaling model, fitted from
stored job outcomes and swapped into `ServiceState` whole.

A failed refit keeps the fit in use, marks it stale (the next bundle poll retries) and counts the
failure on /metrics. The calibration refit is awaited before an outcome is answered; the scaling
refit runs in the background because a fit with its held-out check takes seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from gpuplan_estimator.interfaces.http.metrics import Metrics
from gpuplan_estimator.interfaces.http.state import ServiceState
from gpuplan_estimator.interfaces.http.storage import IoThreads, OutcomeHistory, ScalingHistory
from gpuplan_estimator.parallel import scaling
from gpuplan_estimator.planning import calibrating

log = logging.getLogger(__name__)
_Fitted = TypeVar("_Fitted")


@dataclass(frozen=True)
class ScalingFitSettings:
    """How the scaling model is fitted (`ServiceSettings.scaling_*`)."""
    min_samples: int
    random_state: int


class Refits:
    """Refits the calibration and the scaling model; one of each kind runs at a time, so a slow
    earlier read never replaces a newer fit."""

    def __init__(self, state: ServiceState, metrics: Metrics, io: IoThreads,
                 outcome_history: OutcomeHistory | None,
                 scaling_history: ScalingHistory | None,
                 scaling_fit: ScalingFitSettings,
                 calibration: calibrating.CalibrationSettings) -> None:
        self.state = state
        self.metrics = metrics
        self.io = io
        self.outcome_history = outcome_history
        self.scaling_history = scaling_history
        self.scaling_fit = scaling_fit
        self.calibration = calibration
        self._calibrating = asyncio.Lock()
        self._scaling = asyncio.Lock()
        # The background scaling refit, and whether outcomes arrived while it ran (one more then).
        self._scaling_task: asyncio.Task[None] | None = None
        self._scaling_again = False

    async def _refit(self, lock: asyncio.Lock, fit: Callable[[], _Fitted],
                     swap: Callable[[_Fitted], None], failed: Callable[[], None],
                     what: str) -> _Fitted | None:
        """Run `fit` on the I/O threads under `lock` and `swap` its result in (atomically, like
        the bundle); on any failure log, call `failed` (mark stale, count it), keep what is in
        use and return None. The outcome is stored either way; the next poll retries."""
        async with lock:
            try:
                fitted = await self.io.run(fit)
            except Exception:
                log.exception("refitting the %s from job outcomes failed; keeping the current "
                              "one", what)
                failed()
                return None
            swap(fitted)
        return fitted

    async def refit_calibration(self) -> None:
        """Refit from every stored outcome; on any failure keep the calibration in use."""
        if self.outcome_history is None:
            return
        history = self.outcome_history
        settings = self.calibration
        fitted = await self._refit(self._calibrating, lambda: calibrating.fit(history(), settings),
                                   self.state.set_calibration, self._calibration_failed,
                                   "calibration")
        if fitted is not None:
            log.info("calibration from %d job outcomes: %s", fitted.overall.outcomes,
                     calibrating.summary(fitted))

    def _calibration_failed(self) -> None:
        self.state.calibration_stale = True
        self.metrics.refit_failures.inc()

    def _fit_scaling(self, rows: Sequence[Mapping[str, Any]]) -> scaling.FittedScaling:
        return scaling.fit_from_outcomes(
            rows, min_samples=self.scaling_fit.min_samples,
            random_state=self.scaling_fit.random_state,
            compute_factor=calibrating.single_gpu_compute_factor(rows, self.calibration))

    async def refit_scaling(self) -> None:
        """Refit the scaling model from every stored outcome; on failure keep the one in use."""
        if self.scaling_history is None:
            return
        history = self.scaling_history
        fitted = await self._refit(self._scaling, lambda: self._fit_scaling(history()),
                                   self.state.set_scaling, self._scaling_failed,
                                   "scaling model")
        if fitted is not None:
            log.info("scaling model: %s (%s)", fitted.source, fitted.reason)

    def _scaling_failed(self) -> None:
        self.state.scaling_stale = True
        self.metrics.scaling_refit_failures.inc()

    async def _scaling_refits(self) -> None:
        while True:
            self._scaling_again = False
            await self.refit_scaling()
            if not self._scaling_again:
                return

    def request_scaling_refit(self) -> None:
        """Refit in the background; outcomes arriving meanwhile make one more refit, not one
        each (a burst of outcomes must not queue a fit per outcome)."""
        if self._scaling_task is not None and not self._scaling_task.done():
            self._scaling_again = True
            return
        self._scaling_task = asyncio.create_task(self._scaling_refits())

    def cancel(self) -> None:
        """Stop a background scaling refit (service shutdown)."""
        if self._scaling_task is not None:
            self._scaling_task.cancel()
