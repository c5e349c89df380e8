"""What a retrained bundle keeps from the bundle it replaces: the fits made on profiled steps.

`gpuplan train` fits latency models on kernel rows. Three manifest entries are not fitted on
kernel rows at all but on profiled whole-model steps of a GPU run: the tensor-core GEMM
utilisations (`cost.aligned_gemm`) and the host timeline model (`step.host`), both
`hack/bundle_host_model.py`, and the step-level spread of the intervals
(`intervals.STEP_SIGMA_KEY`, `hack/bundle_step_spread.py`). A retrain from the performance
database has no such steps, so without carrying them a new bundle would quietly price tf32/bf16
GEMMs from the unaligned benchmark rows, every GPU step on one clock (issue #30: up to 2x too
fast), and its intervals too narrow. They are copied, checked, from a base bundle, and the
manifest says from which (`CARRIED_KEY`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuplan_estimator.core import errors
from gpuplan_estimator.cost import aligned_gemm
from gpuplan_estimator.planning import intervals
from gpuplan_estimator.step import host

PROFILE_FIT_KEYS = (aligned_gemm.MANIFEST_KEY, host.MANIFEST_KEY, intervals.STEP_SIGMA_KEY)
"""Manifest entries fitted on profiled whole-model steps, each with its `*_provenance`."""
_PROVENANCE_KEYS = {aligned_gemm.MANIFEST_KEY: aligned_gemm.PROVENANCE_KEY,
                    host.MANIFEST_KEY: host.PROVENANCE_KEY,
                    intervals.STEP_SIGMA_KEY: intervals.STEP_SIGMA_PROVENANCE_KEY}
CARRIED_KEY = "carried_from"
"""Manifest key: ``{"source": where the entries came from, "keys": which}``."""


def profile_fits(base: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The `PROFILE_FIT_KEYS` entries of the `base` manifest (with their provenance and a
    `CARRIED_KEY` record naming `source`), each checked to read; empty when it holds none.

    InvalidRequestError naming `source` and the entry when one does not read: a retrain must
    not hand a broken fit on to every estimate.
    """
    entries: dict[str, Any] = {}
    for key in PROFILE_FIT_KEYS:
        if key not in base:
            continue
        _check(key, base[key], source)
        entries[key] = base[key]
        provenance_key = _PROVENANCE_KEYS[key]
        if provenance_key in base:
            entries[provenance_key] = base[provenance_key]
    if entries:
        entries[CARRIED_KEY] = {"source": source,
                                "keys": [k for k in PROFILE_FIT_KEYS if k in entries]}
    return entries


def _check(key: str, entry: Any, source: str) -> None:
    where = f"{source}: manifest.{key}"
    if not isinstance(entry, Mapping):
        raise errors.InvalidRequestError(where, "must be an object")
    try:
        if key == aligned_gemm.MANIFEST_KEY:
            aligned_gemm.AlignedGemmFit.from_json(entry, where)
        elif key == intervals.STEP_SIGMA_KEY:
            intervals.step_sigma(entry, where)
        else:
            host.model_from_json(entry)
    except ValueError as exc:
        raise errors.InvalidRequestError(where, str(exc)) from exc
