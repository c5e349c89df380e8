"""Runs a benchmark plan on one device into the performance database, resumably.

The sampled plan and its digest are stored with the run; a later invocation with the same
sweep specs, seed, sample count, device and backend finds the unfinished run and measures only
the rows that are still missing.

Stopping early keeps what was measured: `run_bench` checks `stop_requested` before each row
(the CLI sets it on SIGTERM/SIGINT), writes the buffered rows and marks the run
``interrupted``; an exception out of a measurement still writes the buffer, and marks the run
``interrupted`` (KeyboardInterrupt) or ``failed`` before it propagates.
"""

from __future__ import annotations

import contextlib
import json
import platform
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pandas as pd

from gpuplan_estimator import devices
from gpuplan_estimator.bench import nvml, sweep, timing, torch_units, units
from gpuplan_estimator.bench.targets import parse_device
from gpuplan_estimator.core import errors, paths, provenance
from gpuplan_estimator.core.measurements import MEASUREMENT_COLUMNS
from gpuplan_estimator.core.progress import Progress, Step, silent
from gpuplan_estimator.perfdb.store import PerfStore, RunInfo

DEFAULT_SWEEP_DIR = paths.REPO_ROOT / "benchmark-jobs" / "sweeps"
BACKENDS = ("onnxruntime", "torch")
FLUSH_EVERY_ROWS = 10
FLUSH_EVERY_S = 5.0
Clock = Callable[[], float]
StopRequested = Callable[[], bool]
"""Asked before each row; True ends the run after the row being measured (graceful stop)."""


def _never() -> bool:
    return False


@dataclass(frozen=True)
class BenchSettings:
    """What `gpuplan bench` measures and for how long."""

    device: str = "cpu"
    """``cpu``, ``cuda`` or ``cuda:N``."""
    families: tuple[str, ...] | None = None
    """Kernel families to sample (None = every spec found)."""
    samples: int = 200
    """Size of the sampled plan across families."""
    budget_minutes: float = 3.0
    """Stop starting new rows after this long; the run stays resumable."""
    seed: int = 0
    backend: str = "onnxruntime"
    sweep_paths: tuple[str, ...] = (str(DEFAULT_SWEEP_DIR),)
    timing: timing.TimingSettings = field(default_factory=timing.TimingSettings)
    command: str = ""
    """Command line recorded with the run (provenance)."""
    commit: str | None = None
    """The commit measured (``--commit``); None: ``$GPUPLAN_COMMIT`` or gpuplan's own git
    checkout (`provenance.code_commit`), and "" in the run record when none knows."""


@dataclass(frozen=True)
class BenchReport:
    """Outcome of one `run_bench` call: run id, status, row counts and elapsed time."""
    run_id: int
    device: str
    backend: str
    status: str  # done | interrupted
    resumed: bool
    planned: int
    rows_added: int
    rows_total: int
    elapsed_s: float
    intra_op_threads: int

    @property
    def rows_per_min(self) -> float:
        """Rows measured per minute of this invocation (0.0 when no time elapsed)."""
        return 60.0 * self.rows_added / self.elapsed_s if self.elapsed_s > 0 else 0.0


def backend_name(backend: str, kind: str) -> str:
    """Backend label stored with rows, e.g. ``onnxruntime-1.18.0-cuda``."""
    return f"{backend}-{backend_version(backend)}-{kind}"


def backend_version(backend: str) -> str:
    """Installed version of the ``onnxruntime`` or ``torch`` backend."""
    if backend == "onnxruntime":
        return str(ort.__version__)
    if backend == "torch":
        return str(torch_units.import_torch().__version__)
    raise errors.InvalidRequestError("backend", f"expected one of {BACKENDS}, got {backend!r}")




@dataclass(frozen=True)
class Target:
    """The device a benchmark runs on: kind, index, catalog spec and execution provider."""
    kind: str
    index: int
    key: str
    spec: devices.DeviceSpec
    identity: nvml.NvmlIdentity | None
    provider: str


def resolve_target(device: str) -> Target:
    """Resolve a ``cpu`` / ``cuda:N`` string to a catalog device, via NVML for GPUs."""
    kind, index = parse_device(device)
    if kind == "cpu":
        spec = devices.resolve_device("cpu")
        return Target(kind, index, spec.key, spec, None, "CPUExecutionProvider")
    ident = nvml.device_identity(index)
    if ident is None:
        raise errors.GpuplanError(f"{device}: NVML unavailable, cannot identify the GPU")
    spec = devices.resolve_device(ident.name)
    return Target(kind, index, spec.key, spec, ident, "CUDAExecutionProvider")


def _find_resumable(store: PerfStore, key: str, digest: str) -> RunInfo | None:
    """The latest run with this plan digest (a finished one measures nothing new)."""
    runs = store.runs(device=key, sweep_digest=digest)
    return runs[-1] if runs else None


def _measured_keys(store: PerfStore, run_id: int) -> set[tuple[str, str, str, str]]:
    frame = store.measurements(run_id=run_id)
    cols = ["kernel", "op", "dtype", "dims"]
    return {(str(a), str(b), str(c), str(d)) for a, b, c, d in frame[cols].itertuples(index=False)}


def measure_item(
    item: sweep.PlanItem, target: Target, settings: timing.TimingSettings, seed: int,
    backend: str = "onnxruntime",
) -> dict[str, Any]:
    """Build, time and describe one plan item as a measurement-frame row (without source).

    With the torch backend the row also carries ``fwd_bwd_latency_ms``: forward+backward of the
    layer with autograd."""
    rng = np.random.default_rng([seed, *(int(v) for v in item.dims.values())])
    fwd_bwd: timing.TimingResult | None = None
    with nvml.PowerSampler(target.index) if target.kind == "cuda" else _NoPower() as power:
        if backend == "torch":
            device = "cpu" if target.kind == "cpu" else f"cuda:{target.index}"
            layer = torch_units.build_unit(item, rng, device)
            result, fwd_bwd = torch_units.time_unit(layer, device=device, settings=settings)
        else:
            unit = units.build_unit(item, rng)
            result = timing.time_unit(
                unit, provider=target.provider, settings=settings, device_id=target.index
            )
    watts = power.mean_watts
    return {
        "kernel": item.kernel,
        "op": item.op,
        "dtype": item.dtype,
        "dims": sweep.dims_json(item.dims),
        "latency_ms": result.latency_ms,
        "latency_std_ms": result.latency_std_ms,
        "latency_min_ms": result.latency_min_ms,
        "repeats": result.repeats,
        "fwd_bwd_latency_ms": fwd_bwd.latency_ms if fwd_bwd is not None else None,
        "power_watts": watts,
        "energy_mj": watts * result.latency_ms if watts is not None else None,  # W x ms = mJ
        "sm_clock_mhz": power.mean_sm_clock_mhz,
    }


class _NoPower:
    mean_watts: float | None = None
    mean_sm_clock_mhz: float | None = None

    def __enter__(self) -> _NoPower:
        return self

    def __exit__(self, *_: object) -> None:
        return None


def run_bench(
    settings: BenchSettings,
    store: PerfStore,
    *,
    target: Target | None = None,
    clock: Clock = time.monotonic,
    progress: Progress = silent,
    stop_requested: StopRequested = _never,
) -> BenchReport:
    """Measure the plan of `settings` (resuming an unfinished identical run) into `store`.

    The run ends ``done`` when every planned row is stored, else ``interrupted`` (budget spent
    or `stop_requested`); either way the measured rows are in the database. Each measured row
    is reported to `progress` (the plan's rows measured so far, of all planned).
    """
    tgt = target or resolve_target(settings.device)
    backend = backend_name(settings.backend, tgt.kind)
    specs = sweep.load_specs(settings.sweep_paths)
    digest = sweep.plan_digest(
        specs, samples=settings.samples, seed=settings.seed, kind=tgt.kind,
        families=sorted(settings.families) if settings.families else None, backend=backend,
    )
    threads = timing.resolved_threads(settings.timing)
    found = _find_resumable(store, tgt.key, digest)
    if found is not None:
        run_id = found.id
        plan = [sweep.PlanItem.from_json(x) for x in json.loads(found.plan_json)]
        done = _measured_keys(store, run_id)
    else:
        plan = sweep.sample_plan(
            specs, samples=settings.samples, seed=settings.seed, device_kind=tgt.kind,
            families=settings.families,
        )
        run_id = _start_run(store, settings, tgt, backend, digest, plan, threads)
        done = set()
    store.upsert_device(
        tgt.spec,
        nvml_name=tgt.identity.name if tgt.identity else "",
        nvml_uuid=tgt.identity.uuid if tgt.identity else "",
    )
    todo = [it for it in plan if it.key() not in done]
    started = clock()
    try:
        added = _measure_all(store, run_id, todo, tgt, backend, settings, started, clock,
                             progress, stop_requested, already=len(plan) - len(todo),
                             planned=len(plan))
    except BaseException as exc:
        # The rows are flushed (see _measure_all); a run left "running" would look alive to
        # anyone reading the table. Best effort: the database may be what failed.
        status = "failed" if isinstance(exc, Exception) else "interrupted"
        with contextlib.suppress(errors.GpuplanError):
            store.finish_run(run_id, status)
        raise
    # Count from the database: a concurrent run of the same plan may have stored rows too.
    remaining = len(plan) - len(_measured_keys(store, run_id))
    final = "done" if remaining == 0 else "interrupted"
    if todo or found is None or found.status != final:
        store.finish_run(run_id, final)
    return BenchReport(
        run_id=run_id, device=tgt.key, backend=backend, status=final,
        resumed=found is not None, planned=len(plan), rows_added=added,
        rows_total=len(plan) - remaining, elapsed_s=clock() - started, intra_op_threads=threads,
    )


def _start_run(
    store: PerfStore, settings: BenchSettings, tgt: Target, backend: str, digest: str,
    plan: Sequence[sweep.PlanItem], threads: int,
) -> int:
    run_settings = {
        "seed": settings.seed,
        "samples": settings.samples,
        "families": list(settings.families) if settings.families else None,
        "sweep_paths": list(settings.sweep_paths),
        "timing": {**asdict(settings.timing), "intra_op_threads": threads},
        "platform": platform.platform(),
        "cpu_model": tgt.spec.name if tgt.kind == "cpu" else "",
        "nvml": asdict(tgt.identity) if tgt.identity else None,
    }
    return store.add_run(
        device=tgt.key, backend=backend, backend_version=backend_version(settings.backend),
        host=socket.gethostname(), git_commit=provenance.code_commit(settings.commit) or "",
        command=settings.command,
        sweep_digest=digest, source="gpuplan-bench",
        plan_json=json.dumps([it.to_json() for it in plan]), settings=run_settings,
    )


def _measure_all(
    store: PerfStore, run_id: int, todo: Sequence[sweep.PlanItem], tgt: Target, backend: str,
    settings: BenchSettings, started: float, clock: Clock, progress: Progress,
    stop_requested: StopRequested, *, already: int, planned: int,
) -> int:
    deadline = started + settings.budget_minutes * 60.0
    buffer: list[dict[str, Any]] = []
    added = 0
    last_flush = clock()
    task = f"bench {tgt.key}"
    progress(Step(task, already, planned))
    try:
        for measured, item in enumerate(todo, start=already + 1):
            if stop_requested() or clock() >= deadline:
                break
            row = measure_item(item, tgt, settings.timing, settings.seed, settings.backend)
            buffer.append({**row, "device": tgt.key, "backend": backend,
                           "source": f"gpuplan-bench run {run_id}"})
            progress(Step(task, measured, planned, f"{item.kernel} {item.op}"))
            if len(buffer) >= FLUSH_EVERY_ROWS or clock() - last_flush >= FLUSH_EVERY_S:
                added += store.add_measurements(run_id, pd.DataFrame(buffer))
                buffer, last_flush = [], clock()
    finally:
        # Also on a stop request or an exception: what was measured is kept, and the next run
        # resumes after it.
        if buffer:
            added += store.add_measurements(run_id, pd.DataFrame(buffer))
    return added


def export_run(store: PerfStore, run_id: int, path: Path, sidecar: dict[str, Any]) -> int:
    """Write a run's rows as a measurement-frame parquet plus ``<path>.json``; returns rows."""
    frame = store.measurements(run_id=run_id)
    cols = [*MEASUREMENT_COLUMNS, "latency_min_ms", "fwd_bwd_latency_ms"]
    path.parent.mkdir(parents=True, exist_ok=True)
    frame[cols].to_parquet(path, index=False, compression="zstd")
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    return len(frame)
