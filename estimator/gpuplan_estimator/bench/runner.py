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
from gpuplan_estimator.bench import (
    batched,
    nvml,
    precisions,
    shapes,
    stopping,
    sweep,
    timing,
    torch_units,
    units,
)
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
    precisions: tuple[str, ...] | None = None
    """Measure each float32 item in these precisions (`precisions.expand`); None: spec dtypes."""
    batch: batched.BatchSettings | None = None
    """Time many items per launch (`batched`, torch backend); None: the per-row protocol."""
    stop_rule: stopping.StopRule | None = None
    """With `batch`: stop a family once its held-out error stops improving; None: never."""


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
    families: tuple[FamilyReport, ...] = ()
    """Per family (`precisions.family_of`), with the batched protocol only."""
    skipped: int = 0
    """Items not measured: over the byte cap, or failing to build or run (batched only)."""

    @property
    def rows_per_min(self) -> float:
        """Rows measured per minute of this invocation (0.0 when no time elapsed)."""
        return 60.0 * self.rows_added / self.elapsed_s if self.elapsed_s > 0 else 0.0


@dataclass(frozen=True)
class FamilyReport:
    """One kernel family's share of a batched run: rows, time, held-out error, why it ended."""

    family: str
    rows: int
    seconds: float
    heldout_error_pct: float | None
    ended: str  # converged | exhausted | budget
    eager_rows: int = 0
    """Rows timed eagerly between events although graph timing was asked (capture failed)."""

    @property
    def rows_per_min(self) -> float:
        """Rows per minute of this family's own batches (0.0 when none ran)."""
        return 60.0 * self.rows / self.seconds if self.seconds > 0 else 0.0


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
    backend: str = "onnxruntime", set_math: bool = False,
) -> dict[str, Any]:
    """Build, time and describe one plan item as a measurement-frame row (without source).

    With the torch backend the row also carries ``fwd_bwd_latency_ms``: forward+backward of the
    layer with autograd. `set_math` (runs with ``--precisions``) switches TF32 on for tf32
    items and off for the others; without it PyTorch's defaults stay (cuDNN may use TF32)."""
    rng = np.random.default_rng([seed, *(int(v) for v in item.dims.values())])
    fwd_bwd: timing.TimingResult | None = None
    with nvml.PowerSampler(target.index) if target.kind == "cuda" else _NoPower() as power:
        if backend == "torch":
            device = "cpu" if target.kind == "cpu" else f"cuda:{target.index}"
            if set_math:
                torch_units.set_precision_flags(torch_units.import_torch(),
                                                precisions.precision_of(item))
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
    log: Callable[[str], None] = lambda _line: None,
) -> BenchReport:
    """Measure the plan of `settings` (resuming an unfinished identical run) into `store`.

    The run ends ``done`` when every planned row is stored, else ``interrupted`` (budget spent
    or `stop_requested`); either way the measured rows are in the database. Each measured row
    is reported to `progress` (the plan's rows measured so far, of all planned).
    """
    if settings.precisions and settings.backend != "torch":
        # onnxruntime has no switch for TF32 math, and its bf16 kernels are not PyTorch's.
        raise errors.InvalidRequestError("precisions", "needs --backend torch")
    tgt = target or resolve_target(settings.device)
    backend = backend_name(settings.backend, tgt.kind)
    specs = sweep.load_specs(settings.sweep_paths)
    extra = {"precisions": list(settings.precisions)} if settings.precisions else {}
    digest = sweep.plan_digest(
        specs, samples=settings.samples, seed=settings.seed, kind=tgt.kind,
        families=sorted(settings.families) if settings.families else None, backend=backend,
        **extra,
    )
    threads = timing.resolved_threads(settings.timing)
    found = _find_resumable(store, tgt.key, digest)
    if found is not None:
        run_id = found.id
        plan = [sweep.PlanItem.from_json(x) for x in json.loads(found.plan_json)]
        done = _measured_keys(store, run_id)
    else:
        plan = _new_plan(specs, settings, tgt.kind)
        run_id = _start_run(store, settings, tgt, backend, digest, plan, threads)
        done = set()
    store.upsert_device(
        tgt.spec,
        nvml_name=tgt.identity.name if tgt.identity else "",
        nvml_uuid=tgt.identity.uuid if tgt.identity else "",
    )
    todo = [it for it in plan if it.key() not in done]
    started = clock()
    outcome = _BatchedOutcome()
    try:
        if settings.batch is not None:
            outcome = _measure_batched(store, run_id, todo, tgt, backend, settings, started,
                                       clock, progress, stop_requested, log,
                                       already=len(plan) - len(todo), planned=len(plan))
            added = outcome.added
        else:
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
    # A batched run whose every family ended by its stop rule or its queue is done: the
    # unmeasured rows are those the stop rule judged not worth their GPU time.
    final = "done" if remaining == 0 or outcome.all_ended else "interrupted"
    if todo or found is None or found.status != final:
        store.finish_run(run_id, final)
    return BenchReport(
        run_id=run_id, device=tgt.key, backend=backend, status=final,
        resumed=found is not None, planned=len(plan), rows_added=added,
        rows_total=len(plan) - remaining, elapsed_s=clock() - started, intra_op_threads=threads,
        families=outcome.families, skipped=outcome.skipped,
    )


def _new_plan(specs: Sequence[sweep.SweepSpec], settings: BenchSettings,
              device_kind: str) -> list[sweep.PlanItem]:
    """The rows a fresh run measures: sampled from the specs, then one per asked precision."""
    plan = sweep.sample_plan(specs, samples=settings.samples, seed=settings.seed,
                             device_kind=device_kind, families=settings.families)
    return precisions.expand(plan, settings.precisions) if settings.precisions else plan


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
        **({"precisions": list(settings.precisions)} if settings.precisions else {}),
        **({"batch": asdict(settings.batch)} if settings.batch else {}),
        **({"stop_rule": asdict(settings.stop_rule)} if settings.stop_rule else {}),
        **({"versions": torch_units.versions()} if settings.backend == "torch" else {}),
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
            row = measure_item(item, tgt, settings.timing, settings.seed, settings.backend,
                               set_math=bool(settings.precisions))
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



@dataclass
class _FamilyState:
    queue: list[sweep.PlanItem]
    rows: list[stopping.FamilyRow] = field(default_factory=list)
    errors_pct: list[float | None] = field(default_factory=list)
    seconds: float = 0.0
    ended: str = ""
    eager_rows: int = 0


@dataclass
class _BatchedOutcome:
    added: int = 0
    skipped: int = 0
    families: tuple[FamilyReport, ...] = ()
    all_ended: bool = False


def _measure_batched(
    store: PerfStore, run_id: int, todo: Sequence[sweep.PlanItem], tgt: Target, backend: str,
    settings: BenchSettings, started: float, clock: Clock, progress: Progress,
    stop_requested: StopRequested, log: Callable[[str], None], *, already: int, planned: int,
) -> _BatchedOutcome:
    """Round-robin over families, one batch at a time, until each ends or the budget does."""
    assert settings.batch is not None
    bs = settings.batch
    bs.validate()
    if settings.backend != "torch":
        raise errors.InvalidRequestError("batch_size", "batched timing needs --backend torch")
    if settings.stop_rule is not None:
        settings.stop_rule.validate()
    deadline = started + settings.budget_minutes * 60.0
    states: dict[str, _FamilyState] = {}
    for item in todo:
        states.setdefault(precisions.family_of(item), _FamilyState([])).queue.append(item)
    out = _BatchedOutcome()
    measured = already
    task = f"bench {tgt.key}"
    progress(Step(task, measured, planned))
    while not stop_requested() and clock() < deadline:
        active = [f for f, st in states.items() if not st.ended]
        if not active:
            break
        for fam in active:
            if stop_requested() or clock() >= deadline:
                break
            st = states[fam]
            t0 = clock()
            rows, skipped = _next_batch(st, tgt, settings, deadline - clock(), log)
            st.seconds += clock() - t0
            out.skipped += skipped
            methods = [r.pop(_METHOD) for r in rows]
            if settings.batch.mode == "graph" and tgt.kind == "cuda":
                st.eager_rows += sum(m != "graph" for m in methods)
            if rows:
                out.added += store.add_measurements(run_id, pd.DataFrame(
                    [{**r, "device": tgt.key, "backend": backend,
                      "source": f"gpuplan-bench run {run_id}"} for r in rows]))
            measured += len(rows)
            progress(Step(task, measured, planned, fam))
            _update_stop(st, rows, settings.stop_rule)
            log(_progress_line(fam, st, len(rows), _rate(measured - already, clock() - started)))
    for st in states.values():
        if not st.ended:
            st.ended = "budget"
    out.all_ended = all(st.ended in ("converged", "exhausted") for st in states.values())
    out.families = tuple(
        FamilyReport(f, len(st.rows), round(st.seconds, 3),
                     st.errors_pct[-1] if st.errors_pct else None, st.ended, st.eager_rows)
        for f, st in sorted(states.items()))
    return out


def _progress_line(fam: str, st: _FamilyState, added: int, overall_rate: str) -> str:
    err = st.errors_pct[-1] if st.errors_pct else None
    return (f"{fam}: +{added} rows ({len(st.rows)} total, {_rate(len(st.rows), st.seconds)} "
            f"rows/min), held-out error {'-' if err is None else f'{err:.1f} %'}"
            f"{', ' + st.ended if st.ended else ''}; {overall_rate} rows/min overall")


def _rate(rows: int, seconds: float) -> str:
    return f"{60.0 * rows / seconds:.0f}" if seconds > 0 else "-"


def _update_stop(
    st: _FamilyState, rows: Sequence[dict[str, Any]], rule: stopping.StopRule | None
) -> None:
    for r in rows:
        flops, nbytes = shapes.cost(r["kernel"], r["op"], json.loads(r["dims"]), r["dtype"])
        st.rows.append(stopping.FamilyRow(r["op"], flops, nbytes, float(r["latency_ms"])))
    if not st.queue:
        st.ended = "exhausted"
    if rule is None:
        return
    st.errors_pct.append(stopping.heldout_error_pct(st.rows, rule.holdout_every))
    if not st.ended and stopping.should_stop(st.errors_pct, len(st.rows), rule):
        st.ended = "converged"


def _next_batch(
    st: _FamilyState, tgt: Target, settings: BenchSettings, budget_s: float,
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], int]:
    """Measure the next batch of a family's queue; (rows, items skipped). Pops what it used."""
    assert settings.batch is not None
    bs = settings.batch
    head = st.queue[: bs.batch_size * 4]
    sizes = [shapes.cost(it.kernel, it.op, it.dims, it.dtype)[1] for it in head]
    take, skip = batched.take_batch(head, sizes, bs)
    used = set(take) | set(skip)
    items = [head[i] for i in take]
    st.queue = [it for i, it in enumerate(head) if i not in used] + st.queue[len(head):]
    started = time.monotonic()
    rows, failed = _measure_batch_items(items, tgt, settings, budget_s, log)
    if failed and len(items) > 1:
        # One bad item (out of memory, unsupported in this dtype) must not cost the batch:
        # measure the others one by one.
        rows = []
        for it in items:
            left = budget_s - (time.monotonic() - started)
            if left <= 0:
                break
            rows += _measure_batch_items([it], tgt, settings, left, log)[0]
        failed = len(items) - len(rows)
    return rows, len(skip) + failed


def _measure_batch_items(
    items: Sequence[sweep.PlanItem], tgt: Target, settings: BenchSettings, budget_s: float,
    log: Callable[[str], None],
) -> tuple[list[dict[str, Any]], int]:
    """Rows of one batch, or ([], len(items)) when building or timing it failed."""
    assert settings.batch is not None
    if not items:
        return [], 0
    torch = torch_units.import_torch()
    device = "cpu" if tgt.kind == "cpu" else f"cuda:{tgt.index}"
    torch_units.set_precision_flags(torch, precisions.precision_of(items[0]))
    deadline = time.monotonic() + budget_s
    built: list[torch_units.TorchUnit] = []
    try:
        for it in items:
            if time.monotonic() >= deadline:  # building GB-sized CPU inputs takes seconds
                break
            built.append(torch_units.build_unit(
                it, np.random.default_rng([settings.seed, *(int(v) for v in it.dims.values())]),
                device, device_init=True))
        with nvml.PowerSampler(tgt.index) if tgt.kind == "cuda" else _NoPower() as power:
            timings = batched.time_batch(built, torch=torch, device=device,
                                         settings=settings.batch,
                                         budget_s=deadline - time.monotonic())
    except (RuntimeError, errors.GpuplanError) as exc:
        # RuntimeError is how torch reports out of memory and unsupported dtypes.
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
        log(f"{precisions.family_of(items[0])}: a batch of {len(items)} failed: {first}")
        return [], len(items)
    finally:
        built = []
        if tgt.kind == "cuda":
            torch.cuda.empty_cache()  # the batch's tensors and graph pools go back
    clock_mhz = power.mean_sm_clock_mhz
    # Items past the budget (timings is a prefix) are neither rows nor failures.
    return [_row(it, t, clock_mhz) for it, t in zip(items, timings, strict=False)], 0


_METHOD = "_timing_method"
"""Key of a batched row's timing method until it is counted (not a measurement column)."""


def _row(item: sweep.PlanItem, t: batched.ItemTiming, clock_mhz: float | None) -> dict[str, Any]:
    return {
        _METHOD: t.method,
        "kernel": item.kernel, "op": item.op, "dtype": item.dtype,
        "dims": sweep.dims_json(item.dims),
        "latency_ms": t.forward.latency_ms, "latency_std_ms": t.forward.latency_std_ms,
        "latency_min_ms": t.forward.latency_min_ms, "repeats": t.forward.repeats,
        "fwd_bwd_latency_ms": t.forward_backward.latency_ms if t.forward_backward else None,
        # Power is sampled per batch, not per kernel: no per-row energy can be told from it.
        "power_watts": None, "energy_mj": None, "sm_clock_mhz": clock_mhz,
    }


def export_run(store: PerfStore, run_id: int, path: Path, sidecar: dict[str, Any]) -> int:
    """Write a run's rows as a measurement-frame parquet plus ``<path>.json``; returns rows."""
    frame = store.measurements(run_id=run_id)
    cols = [*MEASUREMENT_COLUMNS, "latency_min_ms", "fwd_bwd_latency_ms"]
    path.parent.mkdir(parents=True, exist_ok=True)
    frame[cols].to_parquet(path, index=False, compression="zstd")
    path.with_suffix(".json").write_text(json.dumps(sidecar, indent=2, sort_keys=True) + "\n")
    return len(frame)
