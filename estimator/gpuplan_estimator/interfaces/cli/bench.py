"""`gpuplan bench` and `gpuplan import` subcommands.

The main CLI calls `register(subparsers)`; each subcommand sets ``func`` (args → exit code).
`main(argv)` runs them standalone (``python -m gpuplan_estimator.bench``).

`gpuplan bench` exits 0 when the plan is measured, `EXIT_BUDGET_SPENT` (5) when the budget ran
out, and 128 + the signal number (130 for SIGINT, 143 for SIGTERM, the shell's convention) when
a signal stopped it. The first SIGTERM or SIGINT lets the row being timed finish, writes the
buffered rows and marks the run ``interrupted``; a second one abandons that row at once.
Kubernetes sends SIGTERM and waits ``terminationGracePeriodSeconds`` (30 s by default) before
SIGKILL, which is longer than one row takes.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import shlex
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from gpuplan_estimator.bench import batched, precisions, runner, stopping, timing
from gpuplan_estimator.core import errors, provenance
from gpuplan_estimator.interfaces.cli import arguments, exits, output, probing, progress
from gpuplan_estimator.perfdb import host_probes
from gpuplan_estimator.perfdb.store import PerfStore

EXIT_DONE = exits.ExitCode.OK
EXIT_BUDGET_SPENT = exits.ExitCode.INCOMPLETE
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def exit_code_for_signal(signum: int) -> int:
    """The shell's code for a process ended by signal `signum`: 128 + its number."""
    return 128 + signum


class StopOnSignals:
    """Installs SIGTERM and SIGINT handlers that ask the benchmark to stop after the current row.

    Callable as the runner's `stop_requested`. The first signal only records its number (the
    handler does no I/O: it may run in the middle of a write to the same stream); a second one
    raises KeyboardInterrupt, for a user who does not want to wait for the row. Handlers are
    restored on exit. Only usable in the main thread (a limit of `signal.signal`).
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def __call__(self) -> bool:
        """True once a stop signal arrived."""
        return self.signum is not None

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum

    def __enter__(self) -> StopOnSignals:
        for sig in STOP_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *_: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()


def register(subparsers: Any) -> None:
    """Add ``bench`` and ``import`` to an argparse subparsers object."""
    bench = subparsers.add_parser(
        "bench", help="measure single-kernel latencies on this machine into the perf database",
        description="Sample layer configurations from sweep specs, time them with onnxruntime "
        "(or, with --backend torch, as PyTorch eager layers forward and forward+backward), "
        "store rows in the performance database. An interrupted run resumes.",
    )
    _add_run_flags(bench)
    _add_timing_flags(bench)
    _add_batching_flags(bench)
    probing.add_flags(bench)
    progress.add_flag(bench)
    output.add_output_argument(bench)
    bench.set_defaults(func=run_bench_command)

    imp = subparsers.add_parser(
        "import", help="import measured GPU operator data (gpu-ops parquet/CSV) into the db",
    )
    imp.add_argument("paths", nargs="+", type=Path, metavar="PATH",
                     help="parquet or CSV files, or directories of them")
    imp.add_argument("--db", default=None, metavar="URL",
                     help="database URL (default as for bench)")
    output.add_output_argument(imp)
    imp.set_defaults(func=run_import_command)


def _add_run_flags(bench: argparse.ArgumentParser) -> None:
    """What is measured, where it goes and whose code it is."""
    bench.add_argument("--device", default="cpu", metavar="DEVICE",
                       help="cpu, cuda or cuda:N (default: cpu)")
    bench.add_argument("--families", type=_families, default=None, metavar="KERNELS",
                       help="comma-separated kernels, e.g. gemm,conv2d (default: all specs)")
    bench.add_argument("--samples", type=_positive_int, default=200, metavar="ROWS",
                       help="rows in the sampled plan (default: 200)")
    bench.add_argument("--budget-minutes", type=arguments.duration_minutes, default=3.0,
                       metavar="MINUTES", help="stop starting rows after this long: minutes, or "
                       f"a duration like 90m or 2h; run again to resume, exit "
                       f"{exits.ExitCode.INCOMPLETE} until done (default: 3)")
    bench.add_argument("--seed", type=int, default=0, metavar="SEED",
                       help="sampling seed (default: 0)")
    bench.add_argument("--backend", choices=runner.BACKENDS, default="onnxruntime",
                       help="onnxruntime (single-node graphs) or torch (needs the torch extra; "
                       "rows also carry forward+backward with autograd) (default: onnxruntime)")
    bench.add_argument("--db", default=None, metavar="URL",
                       help="database URL (default: $GPUPLAN_DB_URL or the SQLite file in the "
                       "gpuplan data dir)")
    bench.add_argument("--sweep", action="append", default=None, metavar="PATH",
                       help="sweep spec file or directory (repeatable; default: the repo's "
                       "benchmark-jobs/sweeps)")
    bench.add_argument("--export", type=Path, default=None, metavar="PARQUET",
                       help="also write the run's rows to PARQUET plus a JSON sidecar")
    bench.add_argument("--precisions", type=_precisions, default=None, metavar="LIST",
                       help="measure every float32 item in these precisions, of fp32,tf32,bf16 "
                       "(tf32 only for gemm and conv2d) (default: the dtype of each sweep spec)")
    bench.add_argument("--commit", default=None, metavar="SHA",
                       help=f"the commit measured, for a checkout without .git (default: "
                       f"${provenance.COMMIT_ENV}, else git's HEAD when this is gpuplan's own "
                       f"checkout, else unknown)")


def _add_timing_flags(bench: argparse.ArgumentParser) -> None:
    """How each row is timed."""
    bench.add_argument("--repeats", type=_positive_int, default=5, metavar="R",
                       help="independent timed repeats per row; the row keeps the median of their "
                       "means (default: 5)")
    bench.add_argument("--sessions", type=_positive_int, default=1, metavar="N",
                       help="fresh onnxruntime sessions the R repeats are spread over "
                       "(default: 1)")
    bench.add_argument("--threads", type=int, default=0, metavar="N",
                       help="intra-op threads (default 0: all cores)")


def _add_batching_flags(bench: argparse.ArgumentParser) -> None:
    """The batched torch protocol and the rule that ends a family early."""
    bench.add_argument("--batch-size", type=_positive_int, default=1, metavar="N",
                       help="with --backend torch: build and time N items of one family per "
                       "batch, many calls per timed launch, one sync per batch; families stop "
                       "once their held-out error stops improving (default: 1, the per-row "
                       "protocol)")
    bench.add_argument("--timing", choices=batched.TIMING_MODES, default="graph",
                       help="with --batch-size > 1 on CUDA: K calls captured in a CUDA graph per "
                       "timed launch, or eager calls between events (default: graph; an item "
                       "whose capture fails is timed with events)")
    bench.add_argument("--stop-patience", type=int, default=stopping.StopRule().patience,
                       metavar="BATCHES", help="batches without improvement before a family "
                       "stops; 0 never stops a family (default: %(default)s)")
    bench.add_argument("--stop-min-gain-pct", type=float,
                       default=stopping.StopRule().min_gain_pct, metavar="PCT",
                       help="held-out error gain that counts as improving (default: %(default)s)")
    bench.add_argument("--stop-min-rows", type=_positive_int,
                       default=stopping.StopRule().min_rows, metavar="ROWS",
                       help="rows a family gets before its stop rule may end it "
                       "(default: %(default)s)")
    bench.add_argument("--max-item-gib", type=float,
                       default=batched.BatchSettings().max_item_bytes / 2**30, metavar="GIB",
                       help="with --batch-size > 1: skip items moving more than this many GiB "
                       "(default: %(default)s)")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _families(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("empty family list")
    return names


def _precisions(text: str) -> tuple[str, ...]:
    try:
        return precisions.parse_precisions(text)
    except errors.InvalidRequestError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _batch_settings(args: argparse.Namespace) -> batched.BatchSettings | None:
    if args.batch_size <= 1:
        return None
    max_item = args.max_item_gib * 2**30
    default = batched.BatchSettings()
    return batched.BatchSettings(
        batch_size=args.batch_size, mode=args.timing, repeats=args.repeats,
        max_item_bytes=max_item, max_batch_bytes=max(default.max_batch_bytes, max_item))


def _stop_rule(args: argparse.Namespace) -> stopping.StopRule | None:
    if args.batch_size <= 1 or args.stop_patience == 0:
        return None
    return stopping.StopRule(patience=args.stop_patience, min_gain_pct=args.stop_min_gain_pct,
                             min_rows=args.stop_min_rows)


def _command(argv: Sequence[str] | None) -> str:
    return shlex.join(["gpuplan", *(argv if argv is not None else sys.argv[1:])])


def run_bench_command(args: argparse.Namespace) -> int:
    """`gpuplan bench`: measure the plan into the db; 0 when done, 5 when the budget ran out,
    128 + N when signal N stopped it (the rows measured are stored either way)."""
    settings = _bench_settings(args)
    # Installed before the database opens: a SIGTERM during start-up then also ends cleanly.
    with (StopOnSignals() as stop, PerfStore.open(args.db) as store,
          progress.for_args(args) as bars):
        probe = probing.measure(args, settings.command)
        try:
            report = runner.run_bench(settings, store, progress=bars, stop_requested=stop,
                                      log=_log)
        except KeyboardInterrupt:  # a second signal: the run is marked interrupted already
            signum = stop.signum if stop.signum is not None else signal.SIGINT
            print(f"gpuplan: bench stopped by {signal.Signals(signum).name} (twice); run the "
                  f"same command again to resume", file=sys.stderr)
            return exit_code_for_signal(signum)
        probing.store(store, probe, report.device, report.run_id)
        if output.is_document(args.output):
            output.emit_document(output.document("BenchRun", {
                **dataclasses.asdict(report), "rows_per_min": report.rows_per_min,
                "db": store.url}), args.output)
        else:
            _print_report(report, store.url)
        if args.export is not None:
            _export_run(store, report, settings, probe, args)
    if report.status == "done":  # a signal after the last row changes nothing
        return EXIT_DONE
    if stop.signum is not None:
        print(f"gpuplan: bench stopped by {signal.Signals(stop.signum).name}; run the same "
              f"command again to resume", file=sys.stderr)
        return exit_code_for_signal(stop.signum)
    return EXIT_BUDGET_SPENT


def _bench_settings(args: argparse.Namespace) -> runner.BenchSettings:
    return runner.BenchSettings(
        device=args.device,
        families=args.families,
        samples=args.samples,
        budget_minutes=args.budget_minutes,
        seed=args.seed,
        backend=args.backend,
        sweep_paths=tuple(args.sweep) if args.sweep else runner.BenchSettings().sweep_paths,
        timing=timing.TimingSettings(repeats=args.repeats, intra_op_threads=args.threads,
                                     sessions=args.sessions),
        command=getattr(args, "command_line", "") or _command(None),
        commit=provenance.code_commit(args.commit),
        precisions=args.precisions,
        batch=_batch_settings(args),
        stop_rule=_stop_rule(args),
    )


def _print_report(report: runner.BenchReport, db_url: str) -> None:
    print(
        f"run {report.run_id} on {report.device} ({report.backend}, "
        f"{report.intra_op_threads} threads): {report.status}, "
        f"{report.rows_added} rows added in {report.elapsed_s:.0f} s "
        f"({report.rows_per_min:.0f} rows/min), {report.rows_total}/{report.planned} "
        f"measured{' (resumed)' if report.resumed else ''}; db {db_url}"
    )
    for fam in report.families:
        print(f"  {fam.family}: {fam.rows} rows in {fam.seconds:.1f} s "
              f"({fam.rows_per_min:.0f} rows/min), held-out error "
              f"{_pct(fam.heldout_error_pct)}, {fam.ended}"
              f"{f', {fam.eager_rows} timed eagerly' if fam.eager_rows else ''}")
    if report.skipped:
        print(f"  {report.skipped} items skipped (over --max-item-gib or failed)")


def _export_run(store: PerfStore, report: runner.BenchReport, settings: runner.BenchSettings,
                probe: dict[str, Any] | None, args: argparse.Namespace) -> None:
    """`--export`: the run's rows as parquet, with a sidecar saying where they came from."""
    run = next(r for r in store.runs(device=report.device) if r.id == report.run_id)
    sidecar = {
        "device": report.device,
        "backend": report.backend,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        # The run record's commit (`provenance.code_commit`); null when none knew.
        "commit": run.git_commit or None,
        "command": settings.command,
        "run_id": report.run_id,
        "status": report.status,
        "settings": run.settings_json,
        "rows": report.rows_total,
        "rows_per_min": round(report.rows_per_min, 1),
        "families": [{**dataclasses.asdict(f), "rows_per_min": round(f.rows_per_min, 1)}
                     for f in report.families],
        "skipped": report.skipped,
        # Timings from a busy host are inflated; keep the evidence with the data.
        "load_average_1_5_15": [round(x, 2) for x in os.getloadavg()],
        host_probes.SIDECAR_KEY: probe,
    }
    n = runner.export_run(store, report.run_id, args.export, sidecar)
    output.note(args.output, f"wrote {n} rows to {args.export} (commit "
                f"{run.git_commit or provenance.UNKNOWN_COMMIT})")


def _log(line: str) -> None:
    print(f"gpuplan bench: {line}", file=sys.stderr, flush=True)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} %"


def run_import_command(args: argparse.Namespace) -> int:
    """`gpuplan import`: load gpu-ops parquet/CSV files into the db; returns 0."""
    from gpuplan_estimator.perfdb import importing

    with PerfStore.open(args.db) as store:
        reports = [importing.import_gpu_ops(path, store) for path in args.paths]
    if output.is_document(args.output):
        output.emit_document(output.document("Import", {
            "imports": [dataclasses.asdict(r) for r in reports]}), args.output)
    else:
        for report in reports:
            print(report.summary())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run `bench` or `import` standalone; 2 on a gpuplan error, 130 on Ctrl-C."""
    parser = argparse.ArgumentParser(prog="gpuplan")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    args.command_line = _command(argv)
    try:
        return int(args.func(args))
    except errors.GpuplanError as exc:
        print(f"gpuplan: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("gpuplan: interrupted; run again with the same arguments to resume",
              file=sys.stderr)
        return 130
