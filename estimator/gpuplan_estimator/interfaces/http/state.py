"""What the estimator service's handlers share: the planner context and the fitted corrections.

Split from `service` so the handlers (`routes`) and the refits (`refits`) read it without
importing the module that wires them together.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from gpuplan_estimator.interfaces.http import work
from gpuplan_estimator.latency import selection
from gpuplan_estimator.parallel import scaling
from gpuplan_estimator.planning import calibrating, planner

log = logging.getLogger(__name__)

BundleSync = Callable[[], int | None]
"""Brings the bundle cache in line with the database's active bundle; returns its version, or
None when none is active (`latency.selection.sync_active_bundle` over a `PerfStore`)."""


class ServiceState:
    """What handlers share: the current planner context and the outcome calibration.

    The context is swapped whole on a new bundle, the calibration and the scaling fitted from
    job outcomes swapped whole on a new outcome; `calibration_generation` counts the swaps of
    either (it keys the answer cache).
    `loader` also builds each worker's context, so it must pickle (`work.ContextLoader`).
    `bundle_sync`, when given, runs before each load: when the database's active version is the
    one in use, the load is skipped (no bundle is re-read every poll).
    """

    def __init__(self, context_loader: work.ContextLoader,
                 bundle_sync: BundleSync | None = None) -> None:
        self.loader = context_loader
        self.bundle_sync = bundle_sync
        self.context: planner.PlannerContext | None = None
        self.calibration = calibrating.CalibrationTable()
        self.calibration_generation = 0
        self.calibration_stale = False
        self.scaling: scaling.FittedScaling = scaling.ANALYTIC
        self.scaling_stale = False

    @property
    def bundle_version(self) -> int | None:
        """The database version of the bundle in use; None for a file bundle or none loaded."""
        context = self.context
        return None if context is None else selection.bundle_version_of(context.predictor_source)

    def load(self) -> bool:
        """(Re)load; returns True when a different bundle is now in use."""
        if self.bundle_sync is not None:
            try:
                active = self.bundle_sync()
            except Exception:  # the database is down: serve what the cache points at
                log.exception("asking the performance database for its active bundle failed")
                if self.context is not None:
                    return False
            else:
                if active is not None and self.context is not None \
                        and active == self.bundle_version:
                    return False
        new = self.loader()
        old = self.context
        if old is not None and old.predictor_source == new.predictor_source:
            return False
        self.context = new  # atomic swap: requests in flight keep the old object
        log.info("using predictor %s", new.predictor_source)
        return True

    def set_calibration(self, fitted: calibrating.CalibrationTable) -> None:
        """Swap in a refitted calibration."""
        self.calibration = fitted
        self.calibration_generation += 1
        self.calibration_stale = False

    def set_scaling(self, fitted: scaling.FittedScaling) -> None:
        """Swap in a refitted scaling model (a new cache generation, like the calibration)."""
        self.scaling = fitted
        self.calibration_generation += 1
        self.scaling_stale = False
