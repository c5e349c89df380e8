"""Measurement sources → one measurement frame: gpu-ops dirs, measurement parquet, a database."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from gpuplan_estimator.core import errors, measurements


def load_sources(sources: list[str]) -> pd.DataFrame:
    """One measurement frame from every source (see `register` for the kinds)."""
    frames = [_load_one(s) for s in sources]
    frame = pd.concat(frames, ignore_index=True)
    # Forward+backward timings (torch backend rows) fit the backward factors; others lack them.
    extra = [c for c in measurements.OPTIONAL_TRAIN_COLUMNS if c in frame.columns]
    return frame[[*measurements.MEASUREMENT_COLUMNS, *extra]]


def _load_one(source: str) -> pd.DataFrame:
    if "://" in source:
        from gpuplan_estimator.perfdb.store import PerfStore  # only DB sources need SQLAlchemy

        with PerfStore.open(source) as store:
            return store.measurements()
    path = Path(source)
    if path.is_dir() and (path / "bmm.parquet").exists():
        from gpuplan_estimator.perfdb import importing

        return pd.concat([importing.load_gpu_ops_frame(f) for f in sorted(path.glob("*.parquet"))],
                         ignore_index=True)
    files = sorted(path.glob("*.parquet")) if path.is_dir() else [path]
    if not files or not all(f.is_file() for f in files):
        raise errors.InvalidRequestError("data", f"{source}: no parquet files or database URL")
    frames = []
    for f in files:
        try:
            frames.append(pd.read_parquet(f))
        except Exception as exc:  # pyarrow raises several unrelated types for bad files
            raise errors.InvalidRequestError(
                "data", f"{f}: not a readable parquet: {exc}") from None
        missing = set(measurements.MEASUREMENT_COLUMNS) - set(frames[-1].columns)
        if "dims" in missing and {"op", "device", "latency_ms"} <= set(frames[-1].columns):
            from gpuplan_estimator.perfdb import importing  # a raw gpu-ops file, not a frame

            frames[-1] = importing.load_gpu_ops_frame(f)
            missing = set()
        if missing:
            raise errors.InvalidRequestError("data", f"{f}: missing columns {sorted(missing)}")
    return pd.concat(frames, ignore_index=True)
