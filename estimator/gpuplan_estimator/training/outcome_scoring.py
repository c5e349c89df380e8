"""Job outcomes for the promotion gate: finished TrainingJobs re-estimated by two bundles.

Each outcome that names a stored plan workload (`PerfStore.outcome_workloads`, newest first, at
most `MAX_OUTCOMES`) is re-estimated by the candidate and by the active bundle with
`planning.workloads.repredict_seconds`; the actual seconds and both estimates become
`gating.OutcomeScores`. When none can be scored, the reason says precisely why, and the gate
lists the job-outcome measure as skipped.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuplan_estimator import devices
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.devices.catalog import Catalog
from gpuplan_estimator.perfdb.store import OutcomeWorkload, PerfStore
from gpuplan_estimator.planning import workloads
from gpuplan_estimator.training import gating

MAX_OUTCOMES = 200
"""Newest finished jobs scored per gate: enough for a stable MAPE, bounded in time (the
measured cost is in docs/perfdb-and-bench.md)."""


@dataclass(frozen=True)
class Scored:
    """The gate's job-outcome input: scores, or why there are none (`skipped`)."""

    scores: gating.OutcomeScores | None
    skipped: str
    unreadable: int = 0
    """Stored workloads that could not be read or priced (another schema, an unknown device)."""


def score(rows: Sequence[OutcomeWorkload], candidate: LatencyPredictor,
          active: LatencyPredictor, catalog: Catalog) -> Scored:
    """Re-estimate each row's workload by both predictors (pure but for the predictors)."""
    usable: list[tuple[OutcomeWorkload, workloads.Workload]] = []
    unreadable = 0
    for row in rows:
        try:
            w = workloads.decode(row.workload_zstd)
            catalog.resolve(w.device)
        except Exception:  # another schema or a GPU type this catalog lost: not comparable
            unreadable += 1
            continue
        usable.append((row, w))
    if not usable:
        return Scored(None, f"none of the {len(rows)} stored workloads could be read "
                      f"({unreadable} unreadable)", unreadable)
    loads = [w for _, w in usable]
    return Scored(gating.OutcomeScores(
        actual_seconds=[row.actual_seconds for row, _ in usable],
        candidate_seconds=workloads.repredict_seconds(loads, candidate, catalog),
        active_seconds=workloads.repredict_seconds(loads, active, catalog)), "", unreadable)


def predictor_of(data: bytes, directory: Path) -> LatencyPredictor:
    """The predictor the service would serve from these bundle bytes (unpacked to
    `directory`): `latency.selection`'s bounded learned predictor."""
    from gpuplan_estimator.latency import bundles, selection  # LightGBM: only when scoring

    bundles.unpack_bundle(data, directory)
    predictor, _ = selection.select_predictor(str(directory))
    return predictor


def from_store(store: PerfStore, candidate_bytes: bytes, active_bytes: bytes, *,
               limit: int = MAX_OUTCOMES) -> Scored:
    """Score the newest `limit` outcomes with a stored workload, or say why none is scored."""
    rows = store.outcome_workloads(limit=limit)
    if not rows:
        total, linked = store.outcome_counts()
        if total == 0:
            why = "no finished job has reported an outcome yet"
        elif linked == 0:
            why = (f"no finished job with a stored workload ({total} outcomes, none names a "
                   f"plan workload: reported by an operator or estimator that predates them)")
        else:
            why = (f"no finished job with a stored workload ({linked} of {total} outcomes "
                   f"name one that is not in the database)")
        return Scored(None, why)
    with tempfile.TemporaryDirectory(prefix="gpuplan-gate-") as scratch:
        candidate = predictor_of(candidate_bytes, Path(scratch) / "candidate")
        active = predictor_of(active_bytes, Path(scratch) / "active")
        return score(rows, candidate, active, devices.load_catalog())
