"""Import of the shared GPU operator measurements (`shared/data/gpu-ops`, NeuSight ASPLOS'25).

`load_gpu_ops_frame` is the pure mapping of one parquet/CSV file onto the measurement frame
(`measurements.py`) with the canonical dims of `workload.py`; `import_gpu_ops` stores files
into the performance database, one run per (file, device, backend), idempotently. Files that
already are measurement frames (`gpuplan bench --export`, benchmark Jobs) are imported as-is.

Column semantics (from the data's README): bmm is ``X[B,M,N] @ Y[B,N,K]``, so **N is the
contraction**; linear is ``nn.Linear(N, K, bias=True)`` on ``X[B,M,N]``; every latency is the
mean of the 5 fastest of 25 eager calls in PyTorch 2.1.0 + CUDA 12.1, FP32.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors
from gpuplan_estimator.core.measurements import (
    MEASUREMENT_COLUMNS,
    SHARED_OPS_BACKEND,
    dims_from_json,
)
from gpuplan_estimator.perfdb import host_probes
from gpuplan_estimator.perfdb.store import PerfStore

BACKEND = SHARED_OPS_BACKEND
DTYPE = "float32"
REPEATS = 5  # the kept statistic averages the 5 fastest of 25 calls
PROTOCOL = "NeuSight gpu-ops; latency = mean of the 5 fastest of 25 eager calls"
MAX_FILE_BYTES = 512 << 20
MAX_SIDECAR_BYTES = 1 << 20
"""A `gpuplan bench --export` sidecar is a few KiB of provenance."""
BINARY_OPS = frozenset({"add", "mul", "div", "pow"})
UNARY_OPS = frozenset({"addu", "mulu", "divu", "powu", "relu", "gelu", "tanh"})

Mapper = Callable[[pd.DataFrame], tuple[str, pd.Series, pd.Series]]  # kernel, op, dims JSON


def _json(parts: Mapping[str, pd.Series | int]) -> pd.Series:
    """Vectorised `measurements.dims_to_json` (sorted keys, no spaces) for int columns."""
    index = next(v.index for v in parts.values() if isinstance(v, pd.Series))
    out = pd.Series("{", index=index)
    for i, key in enumerate(sorted(parts)):
        value = parts[key]
        text = value.astype("int64").astype(str) if isinstance(value, pd.Series) else str(value)
        out = out + ("" if i == 0 else ",") + f'"{key}":' + text
    return out + "}"


def _gemm(bias: int) -> Mapper:
    def mapper(f: pd.DataFrame) -> tuple[str, pd.Series, pd.Series]:
        # N is the contraction dim in both bmm and linear; K is the output columns.
        dims = _json({"batch": f["B"], "m": f["M"], "k": f["N"], "n": f["K"], "bias": bias})
        return "gemm", pd.Series("matmul", index=f.index), dims

    return mapper


def _conv(f: pd.DataFrame) -> tuple[str, pd.Series, pd.Series]:
    k, s, p = f["kernel_size"], f["Stride"], f["Padding"]
    dims = _json({
        "batch": f["B"], "c_in": f["Input_Channel"], "c_out": f["Output_Channel"],
        "h": f["Input_Size"], "w": f["Input_Size"], "kernel_h": k, "kernel_w": k,
        "stride_h": s, "stride_w": s, "pad_h": p, "pad_w": p,
        "dilation_h": 1, "dilation_w": 1, "groups": 1,
    })
    return "conv2d", pd.Series("conv", index=f.index), dims


def _rows_cols(kernel: str) -> Mapper:
    def mapper(f: pd.DataFrame) -> tuple[str, pd.Series, pd.Series]:
        return kernel, pd.Series(kernel, index=f.index), _json({"rows": f["B"], "cols": f["H"]})

    return mapper


def _elementwise(f: pd.DataFrame) -> tuple[str, pd.Series, pd.Series]:
    operands = pd.Series(np.where(f["op"].isin(list(BINARY_OPS)), 2, 1), index=f.index)
    dims = _json({"rows": f["B"], "cols": f["H"], "operands": operands})
    return "elementwise", f["op"].astype(str), dims


# op value -> (shape columns, mapper)
_SHAPES_GEMM = ("B", "M", "N", "K")
_SHAPES_CONV = ("B", "Input_Channel", "Output_Channel", "kernel_size", "Input_Size", "Stride",
                "Padding")
_MAPPERS: dict[str, tuple[tuple[str, ...], Mapper]] = {
    "bmm": (_SHAPES_GEMM, _gemm(0)),
    "linear": (_SHAPES_GEMM, _gemm(1)),
    "conv": (_SHAPES_CONV, _conv),
    "ln": (("B", "H"), _rows_cols("layernorm")),
    "softmax": (("B", "H"), _rows_cols("softmax")),
    **{op: (("B", "H"), _elementwise) for op in BINARY_OPS | UNARY_OPS},
}


def _read(path: Path) -> pd.DataFrame:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise errors.GpuplanError(f"{path}: cannot read: {exc.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise errors.GpuplanError(f"{path}: {size} bytes exceeds the {MAX_FILE_BYTES} cap")
    try:
        if path.suffix == ".parquet":
            return pd.read_parquet(path)
        if path.suffix == ".csv":
            return pd.read_csv(path)
    except Exception as exc:  # pyarrow/pandas raise many types for a corrupt file
        raise errors.GpuplanError(f"{path}: not a readable {path.suffix[1:]} file: {exc}") from exc
    raise errors.GpuplanError(f"{path}: unsupported file type (expected .parquet or .csv)")


def _require(path: Path, frame: pd.DataFrame, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise errors.GpuplanError(f"{path}: missing column(s) {', '.join(missing)}")
    for c in columns:
        if frame[c].isna().any():
            raise errors.GpuplanError(f"{path}: column {c} has empty values")


def _check_ints(path: Path, frame: pd.DataFrame, columns: tuple[str, ...]) -> None:
    for c in columns:
        values = pd.to_numeric(frame[c], errors="coerce")
        bad = values.isna() | (values < 0) | (values != np.floor(values))
        if bad.any():
            row = int(np.flatnonzero(bad.to_numpy())[0])
            raise errors.GpuplanError(
                f"{path}: column {c} must hold non-negative integers (row {row}: "
                f"{frame[c].iloc[row]!r})"
            )


def load_gpu_ops_frame(
    path: str | Path, *, catalog: devices.Catalog | None = None
) -> pd.DataFrame:
    """One gpu-ops file (parquet or CSV) as a measurement frame; bad input names file and column."""
    p = Path(path)
    raw = _read(p)
    _require(p, raw, ("op", "device", "latency_ms"))
    unknown = sorted(set(raw["op"].astype(str)) - set(_MAPPERS))
    if unknown:
        raise errors.GpuplanError(f"{p}: column op has unknown value(s) {', '.join(unknown[:5])}")
    latency = pd.to_numeric(raw["latency_ms"], errors="coerce")
    if (latency.isna() | ~(latency > 0)).any():
        raise errors.GpuplanError(f"{p}: column latency_ms must be positive numbers")
    parts = []
    for op_value, group in raw.groupby(raw["op"].astype(str), sort=True):
        shape_cols, mapper = _MAPPERS[str(op_value)]
        _require(p, group, shape_cols)
        _check_ints(p, group, shape_cols)
        kernel, ops, dims = mapper(group)
        parts.append(pd.DataFrame({
            "device_name": group["device"].astype(str), "kernel": kernel, "op": ops,
            "dims": dims, "latency_ms": latency.loc[group.index],
        }))
    frame = pd.concat(parts).sort_index(kind="stable") if parts else pd.DataFrame(
        columns=["device_name", "kernel", "op", "dims", "latency_ms"])
    keys = {n: _device_key(p, n, catalog) for n in frame["device_name"].unique()}
    frame["device"] = frame.pop("device_name").map(keys)
    frame["backend"] = BACKEND
    frame["dtype"] = DTYPE
    frame["latency_std_ms"] = np.nan
    frame["repeats"] = REPEATS
    frame["source"] = f"{p.name} ({PROTOCOL})"
    return frame[list(MEASUREMENT_COLUMNS)].reset_index(drop=True)


def load_measurement_file(
    path: str | Path, *, catalog: devices.Catalog | None = None
) -> pd.DataFrame:
    """A file that already is a measurement frame, validated; device names canonicalised."""
    p = Path(path)
    raw = _read(p)
    _require(p, raw, MEASUREMENT_COLUMNS)
    latency = pd.to_numeric(raw["latency_ms"], errors="coerce")
    if (latency.isna() | ~(latency > 0)).any():
        raise errors.GpuplanError(f"{p}: column latency_ms must be positive numbers")
    for row, text in enumerate(raw["dims"]):
        try:
            dims_from_json(str(text))
        except (ValueError, TypeError, AttributeError) as exc:
            raise errors.GpuplanError(f"{p}: column dims row {row}: not a JSON object of "
                                      f"ints: {text!r}") from exc
    frame = raw.copy()
    keys = {n: _device_key(p, str(n), catalog) for n in frame["device"].unique()}
    frame["device"] = frame["device"].map(keys)
    return frame


def _header(path: Path) -> list[str]:
    """Column names without reading the data; [] when unreadable (the loader reports it)."""
    try:
        if path.suffix == ".parquet":
            return list(pq.read_schema(path).names)
        if path.suffix == ".csv":
            return list(pd.read_csv(path, nrows=0).columns)
    except Exception:
        return []
    return []


def _load_any(path: Path, catalog: devices.Catalog | None) -> pd.DataFrame:
    if set(MEASUREMENT_COLUMNS) <= set(_header(path)):
        return load_measurement_file(path, catalog=catalog)
    return load_gpu_ops_frame(path, catalog=catalog)


def _device_key(path: Path, name: str, catalog: devices.Catalog | None) -> str:
    try:
        return devices.canonical_key(name, catalog)
    except errors.UnknownDeviceError as exc:
        raise errors.GpuplanError(f"{path}: column device: {exc}") from exc


@dataclass
class ImportReport:
    """What `import_gpu_ops` did: files read, rows read and added, runs, elapsed seconds."""
    files: list[str] = field(default_factory=list)
    rows_read: int = 0
    rows_added: int = 0
    runs: list[tuple[str, str, int, int]] = field(default_factory=list)  # file, device, run, added
    elapsed_s: float = 0.0
    host_probes_added: int = 0
    """Host probes stored from the files' sidecars (`gpuplan bench --export`)."""

    def summary(self) -> str:
        """One line for the terminal: files, rows read and added, runs and elapsed time."""
        return (
            f"imported {len(self.files)} file(s): {self.rows_read} rows read, "
            f"{self.rows_added} added ({self.rows_read - self.rows_added} already present) "
            f"in {len(self.runs)} run(s), {self.elapsed_s:.1f} s"
            + (f"; {self.host_probes_added} host probe(s) added" if self.host_probes_added
               else "")
        )


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        found = sorted([*path.glob("*.parquet"), *path.glob("*.csv")])
        if not found:
            raise errors.GpuplanError(f"{path}: no .parquet or .csv files")
        return found
    if not path.exists():
        raise errors.GpuplanError(f"{path}: no such file or directory")
    return [path]


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def import_gpu_ops(
    path_or_dir: str | Path,
    store: PerfStore,
    *,
    catalog: devices.Catalog | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> ImportReport:
    """Import gpu-ops files into `store`: one run per (file, device); re-import adds nothing."""
    started = clock()
    report = ImportReport()
    for file in _files(Path(path_or_dir)):
        frame = _load_any(file, catalog)
        digest = _digest(file)
        source = f"import {file.name} sha256:{digest[:16]}"
        report.files.append(str(file))
        report.rows_read += len(frame)
        for (device, backend), rows in frame.groupby(["device", "backend"], sort=True):
            run_id = _run_for(store, str(device), str(backend), source, digest)
            added = store.add_measurements(run_id, rows)
            store.finish_run(run_id, "done")
            report.rows_added += added
            report.runs.append((file.name, str(device), run_id, added))
        report.host_probes_added += _import_probe(file, store, catalog, report.runs)
    report.elapsed_s = clock() - started
    return report


def _import_probe(file: Path, store: PerfStore, catalog: devices.Catalog | None,
                  runs: list[tuple[str, str, int, int]]) -> int:
    """Store the host probe of `file`'s sidecar (``<file>.json`` beside a `gpuplan bench
    --export` parquet), with the run imported for its device; 1 when stored, 0 when there is
    none or it is stored already."""
    sidecar = file.with_suffix(".json")
    if file.suffix != ".parquet" or not sidecar.is_file():
        return 0
    doc = _read_sidecar(sidecar)
    probe = doc.get(host_probes.SIDECAR_KEY)
    if probe is None:  # exported with --no-host-probe, or before probes existed
        return 0
    device = doc.get("device")
    if not isinstance(device, str):
        raise errors.GpuplanError(f"{sidecar}: field device must be a string, got {device!r}")
    key = _device_key(sidecar, device, catalog)
    run_id = next((run for name, dev, run, _ in runs if name == file.name and dev == key), None)
    try:
        row = host_probes.row_from_document(probe, key)
    except errors.InvalidRequestError as exc:
        raise errors.GpuplanError(f"{sidecar}: field {host_probes.SIDECAR_KEY}."
                                  f"{exc.field}: {exc.message}") from exc
    return int(store.add_host_probe(row, run_id=run_id))


def _read_sidecar(path: Path) -> dict[str, object]:
    size = path.stat().st_size
    if size > MAX_SIDECAR_BYTES:
        raise errors.GpuplanError(f"{path}: {size} bytes exceeds the {MAX_SIDECAR_BYTES} cap")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise errors.GpuplanError(f"{path}: not a readable JSON sidecar: {exc}") from exc
    if not isinstance(doc, dict):
        raise errors.GpuplanError(f"{path}: a sidecar must be a JSON object")
    return doc


def _run_for(store: PerfStore, device: str, backend: str, source: str, digest: str) -> int:
    existing = [r for r in store.runs(device=device, source=source) if r.backend == backend]
    if existing:
        return existing[0].id
    return store.add_run(
        device=device, backend=backend, host="",
        command="gpuplan import", sweep_digest=digest[:32], source=source,
        settings={"protocol": PROTOCOL} if backend == BACKEND else {},
    )
