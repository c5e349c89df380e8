"""Measurement frames on their way into the database: validation, occurrence keys, records."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from gpuplan_estimator.core import errors
from gpuplan_estimator.core.measurements import MEASUREMENT_COLUMNS

KEY_COLUMNS: tuple[str, ...] = ("device", "backend", "kernel", "op", "dtype", "dims")
OPTIONAL_COLUMNS: dict[str, Any] = {
    "latency_min_ms": None,
    "power_watts": None,
    "energy_mj": None,
    "sm_clock_mhz": None,
    "fwd_bwd_latency_ms": None,
}
EXTRA_COLUMNS: tuple[str, ...] = (
    "latency_min_ms", "power_watts", "energy_mj", "sm_clock_mhz", "fwd_bwd_latency_ms", "run_id",
)
DEFAULT_FEATURE_SCHEMA_VERSION = 1


def jsonable(value: Any) -> Any:
    """`json.dumps` fallback: mappings as dicts, tuples and sets as lists, anything else as str."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple | set | frozenset):
        return list(value)
    return str(value)


def prepare_rows(run_id: int, frame: pd.DataFrame) -> pd.DataFrame:
    """Validate a measurement frame and add defaults, occurrence number ``seq`` and ``run_id``."""
    missing = [c for c in MEASUREMENT_COLUMNS if c not in frame.columns]
    if missing:
        raise errors.GpuplanError(f"measurement frame lacks column(s): {', '.join(missing)}")
    if frame.empty:
        return frame.iloc[0:0]
    rows = frame.copy()
    for col, default in OPTIONAL_COLUMNS.items():
        if col not in rows.columns:
            rows[col] = default
    if "feature_schema_version" not in rows.columns:
        rows["feature_schema_version"] = DEFAULT_FEATURE_SCHEMA_VERSION
    latency_ms = rows["latency_ms"].astype("float64")
    # NaN fails both tests; an infinite latency would poison every model fitted on the rows.
    bad = ~(latency_ms > 0) | ~np.isfinite(latency_ms)
    if bad.any():
        raise errors.GpuplanError(
            f"measurement frame column latency_ms: {int(bad.sum())} row(s) not finite and "
            f"positive"
        )
    rows["seq"] = rows.groupby(list(KEY_COLUMNS), sort=False).cumcount()
    rows["run_id"] = run_id
    keep = [
        *KEY_COLUMNS, "seq", "run_id", "latency_ms", "latency_std_ms", "repeats", "source",
        "feature_schema_version", *OPTIONAL_COLUMNS,
    ]
    return rows[keep]


def to_records(rows: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as insertable dicts, with NaN and other missing values as None."""
    out = rows.astype(object).where(rows.notna(), None)
    records: list[dict[str, Any]] = out.to_dict("records")  # type: ignore[assignment]
    return records
