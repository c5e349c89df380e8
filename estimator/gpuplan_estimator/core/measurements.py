"""The measurement frame: the one tabular shape benchmark rows have everywhere.

Importers (shared GPU data, `gpuplan bench`) produce it, the performance database stores it,
and training reads it. One row = one kernel-shaped work item timed on one device.

Columns:
- ``device``: catalog key (`devices`), ``backend``: e.g. ``pytorch-2.1.0+cu121`` or
  ``onnxruntime-1.23.2-cpu``
- ``kernel``, ``op``, ``dtype``: as in `workload.WorkItem`
- ``dims``: JSON object text of the canonical dims of `workload` (sorted keys)
- ``latency_ms``: the kept statistic (median of repeats, or the source's statistic)
- ``latency_std_ms``, ``repeats``: dispersion and repeat count (NaN / 0 when unknown)
- ``source``: where the row came from (file, run id)
"""

from __future__ import annotations

import json
from collections.abc import Mapping

SHARED_OPS_BACKEND = "pytorch-2.1.0+cu121"
"""The backend of the shared gpu-ops rows (NeuSight's collection): each op timed as one eager
call with events around it, so a row holds that call's host dispatch as well as its kernels.
Every other GPU backend's rows (`gpuplan bench`: CUDA graphs, or K calls per event pair) are
the kernels' stream time only."""

MEASUREMENT_COLUMNS: tuple[str, ...] = (
    "device",
    "backend",
    "kernel",
    "op",
    "dtype",
    "dims",
    "latency_ms",
    "latency_std_ms",
    "repeats",
    "source",
)
OPTIONAL_TRAIN_COLUMNS: tuple[str, ...] = ("fwd_bwd_latency_ms",)
"""Used by training when present: forward+backward with autograd (`backward_factors`)."""


def dims_to_json(dims: Mapping[str, int]) -> str:
    """Canonical dims as the ``dims`` column text: compact JSON, sorted keys."""
    return json.dumps({k: int(v) for k, v in sorted(dims.items())}, separators=(",", ":"))


def dims_from_json(text: str) -> dict[str, int]:
    """Parse a ``dims`` column value back into a name → int mapping."""
    return {str(k): int(v) for k, v in json.loads(text).items()}
