"""`gpuplan train`: read measurements (gpu-ops dirs, measurement parquet, a database), fit, save.

``--shipped`` rebuilds the shipped default bundle from ``$GPUPLAN_SHARED_DATA/gpu-ops``
(default ``../shared/data`` next to the repo) plus the CPU measurements in the package data.
``--db URL --candidate`` trains from the database's rows and stores the bundle there as a
candidate (issue #17); ``--promote`` then runs the promotion gate (exit 0 promoted, 3 refused).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import shlex
import tempfile
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuplan_estimator.core import errors, provenance
from gpuplan_estimator.core.exit_codes import ExitCode
from gpuplan_estimator.interfaces.cli import models as models_cli
from gpuplan_estimator.interfaces.cli import output, progress
from gpuplan_estimator.latency import bundles
from gpuplan_estimator.training import carry, fitting, recipe, report, sources


def register(subparsers: Any) -> None:
    """Add the `train` and `models-report` subcommands."""
    r = subparsers.add_parser("models-report",
                              help="write the latency models' accuracy report from a bundle")
    r.add_argument("--bundle", type=Path, default=bundles.SHIPPED_BUNDLE, metavar="DIR",
                   help="model bundle directory to report on (default: the shipped bundle)")
    r.add_argument("--doc", type=Path, default=Path("docs/latency-models.md"), metavar="PATH",
                   help="Markdown file the report is also written to (default %(default)s)")
    r.set_defaults(func=run_report)
    p = subparsers.add_parser("train", help="fit the per-kernel latency models into a bundle")
    p.add_argument("--data", action="append", default=[], metavar="DIR_OR_DB_URL",
                   help="gpu-ops dir, measurement parquet file/dir, or database URL (repeatable)")
    p.add_argument("--out", type=Path, metavar="DIR",
                   help="bundle directory (default: a new one in the data dir)")
    p.add_argument("--shipped", action="store_true",
                   help="rebuild the shipped default bundle from the shared data + CPU rows")
    p.add_argument("--seed", type=int, default=0,
                   help="random seed of subsampling, the held-out split and LightGBM "
                   "(default %(default)s)")
    p.add_argument("--max-rows", type=int, default=recipe.SHIPPED_MAX_ROWS, metavar="ROWS",
                   help="subsample cap per kernel, in rows (default %(default)s)")
    p.add_argument("--no-validate", action="store_true", help="skip held-out validation")
    carry_from = p.add_mutually_exclusive_group()
    carry_from.add_argument(
        "--carry-from", type=Path, metavar="DIR",
        help="bundle whose fits on profiled GPU steps (tensor-core GEMM utilisation, host "
        "model) the new bundle keeps (default: --db's active bundle, else the shipped one)")
    carry_from.add_argument("--no-carry", action="store_true",
                            help="keep no fits on profiled steps: price every GEMM from the "
                            "kernel rows and GPU steps on one clock")
    p.add_argument("--db", default=None, metavar="URL",
                   help="performance database: its rows are a training source, and "
                   "--candidate stores the bundle there")
    p.add_argument("--candidate", action="store_true",
                   help="store the bundle in --db's model_bundles as a candidate (needs --db)")
    p.add_argument("--promote", action="store_true",
                   help="after --candidate: run the promotion gate and activate the candidate "
                   "only if it is no worse than the active bundle (exit 3: refused)")
    progress.add_flag(p)
    output.add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Fit a bundle from the named sources (or the shipped recipe) and save it."""
    sources = list(args.data) + ([args.db] if args.db else [])
    out: Path | None = args.out
    if (args.candidate or args.promote) and not args.db:
        raise errors.InvalidRequestError("--db", "--candidate and --promote need --db URL")
    if args.promote and not args.candidate:
        raise errors.InvalidRequestError("--promote", "gates a new candidate: add --candidate")
    if args.candidate and args.no_validate:
        raise errors.InvalidRequestError(
            "--no-validate", "a candidate needs held-out metrics for the promotion gate")
    if args.shipped:
        sources = recipe.shipped_sources() + sources
        out = out or bundles.SHIPPED_BUNDLE
    if not sources:
        raise errors.InvalidRequestError("--data", "give at least one --data source or --shipped")
    if args.max_rows < 100:
        raise errors.InvalidRequestError("--max-rows", "must be at least 100")
    carried = profile_fits(args)
    frame = load_sources(sources)
    settings = fitting.TrainSettings(seed=args.seed, max_rows_per_kernel=args.max_rows,
                                   kernel_params=recipe.KERNEL_PARAMS,
                                     transfer_params=recipe.TRANSFER_PARAMS,
                                     cpu_params=recipe.CPU_PARAMS)
    command = command_line(args)
    start_s = time.perf_counter()
    with progress.for_args(args) as bars:
        fitted = fitting.train_bundle(frame, settings, command=command,
                                      commit=provenance.git_commit(short=True),
                                      validate=not args.no_validate, progress=bars)
    elapsed_s = round(time.perf_counter() - start_s, 1)
    fitted = dataclasses.replace(
        fitted, manifest={**fitted.manifest, "training_seconds": elapsed_s, **carried})
    if args.candidate:
        return _store_candidate(args, fitted, out, rows=len(frame))
    out = out or bundles.default_data_dir() / datetime.now().strftime("bundle-%Y%m%dT%H%M%S")
    bundles.save_bundle(fitted, out)
    metrics = fitted.manifest.get("metrics", {})
    probes = fitted.manifest.get("probe_offsets", {})
    if output.is_document(args.output):
        output.emit_document(output.document("TrainedBundle", {
            "bundle": str(out), "rows": len(frame), "kernels": sorted(fitted.models),
            "training_seconds": elapsed_s, "metrics": metrics, "probe_offsets": probes,
            "carried": carried.get(carry.CARRIED_KEY)}), args.output)
        return 0
    print(f"wrote bundle {out} ({', '.join(sorted(fitted.models))}; {len(frame)} rows)")
    _print_carried(carried)
    for kernel, m in metrics.items():
        rs = m["random_split"]
        print(f"  {kernel:12s} held-out MAPE {rs['mape_pct']:6.2f} %  "
              f"P90 APE {rs['p90_ape_pct']:6.2f} %")
    for device, kernels in sorted(probes.items()):
        parts = ", ".join(f"{k} ({v['rows']} rows, x{math.exp(v['log_offset']):.2f} at 1 ms "
                          f"base)" for k, v in sorted(kernels.items()))
        print(f"  probed {device}: {parts}")
    return 0


def profile_fits(args: argparse.Namespace) -> dict[str, Any]:
    """The manifest entries fitted on profiled GPU steps that the new bundle keeps
    (`training.carry`): from --carry-from, else --db's active bundle, else the shipped one."""
    if args.no_carry:
        return {}
    if args.carry_from is not None:
        return carry.profile_fits(bundles.read_manifest(args.carry_from), str(args.carry_from))
    if args.db:
        from gpuplan_estimator.perfdb import PerfStore  # SQLAlchemy only for database commands

        with PerfStore.open(args.db) as store:
            active = store.active_bundle()
        if active is not None:
            version, packed = active
            return carry.profile_fits(bundles.packed_manifest(packed),
                                      f"database bundle version {version}")
    return carry.profile_fits(bundles.read_manifest(bundles.SHIPPED_BUNDLE), "shipped bundle")


def _print_carried(carried: dict[str, Any]) -> None:
    record = carried.get(carry.CARRIED_KEY)
    if record is None:
        print("  kept no fits on profiled GPU steps: GEMMs priced from kernel rows only, "
              "GPU steps on one clock")
        return
    print(f"  kept {', '.join(record['keys'])} from the {record['source']}")


def _store_candidate(args: argparse.Namespace, fitted: bundles.Bundle, out: Path | None, *,
                     rows: int) -> int:
    """Save the bundle (to --out, else a scratch dir), store it as a candidate in --db, and
    with --promote gate it; 0 stored or promoted, 3 refused."""
    from gpuplan_estimator.perfdb import PerfStore  # SQLAlchemy only for database commands

    with tempfile.TemporaryDirectory(prefix="gpuplan-candidate-") as scratch:
        directory = bundles.save_bundle(fitted, out or Path(scratch) / "bundle")
        with PerfStore.open(args.db) as store:
            version = store.add_bundle(directory, state="candidate",
                                       reason="gpuplan train --candidate")
            decision = models_cli.promote(store, version, force=False)[0] if args.promote \
                else None
    if decision is not None:
        models_cli.emit_decision(args, version, decision)
        return int(ExitCode.OK if decision.promote else ExitCode.INFEASIBLE)
    if output.is_document(args.output):
        output.emit_document(output.document("CandidateBundle", {
            "version": version, "rows": rows, "kernels": sorted(fitted.models),
            "carried": fitted.manifest.get(carry.CARRIED_KEY),
            "device_rows": fitted.manifest.get("device_rows", {}),
            "metrics": fitted.manifest.get("metrics", {})}), args.output)
        return 0
    print(f"stored candidate bundle version {version} ({rows} rows); promote it with "
          f"`gpuplan models promote {version}`")
    _print_carried(dict(fitted.manifest))
    return 0


def command_line(args: argparse.Namespace) -> str:
    """The equivalent `gpuplan train` command, recorded in the manifest."""
    parts = ["gpuplan", "train", *(["--shipped"] if args.shipped else [])]
    for source in args.data:
        parts += ["--data", source]
    if args.db:
        parts += ["--db", _redacted(args.db)]
    parts += [*(["--candidate"] if args.candidate else []),
              *(["--promote"] if args.promote else [])]
    if args.out is not None and not args.shipped:
        parts += ["--out", str(args.out)]
    parts += ["--seed", str(args.seed), "--max-rows", str(args.max_rows)]
    return shlex.join(parts) + (" --no-validate" if args.no_validate else "")


def _redacted(url: str) -> str:
    """A database URL without its password (the command is stored in the manifest)."""
    return re.sub(r"(://[^/:@]*):[^/@]*@", r"\1:***@", url)


def load_sources(names: Sequence[str]) -> Any:
    """`sources.load_sources`, with errors that name the `--data` flag."""
    try:
        return sources.load_sources(list(names))
    except errors.InvalidRequestError as exc:
        if exc.field != "data":
            raise
        raise errors.InvalidRequestError("--data", exc.message) from exc


def run_report(args: argparse.Namespace) -> int:
    """Print and write the accuracy report of a bundle's latency models."""
    manifest = bundles.read_manifest(args.bundle)
    command = shlex.join(["gpuplan", "models-report", "--bundle", str(args.bundle),
                          "--doc", str(args.doc)])
    text = report.report_markdown(manifest, today=datetime.now().date().isoformat(),
                                  command=command)
    print(text)
    args.doc.parent.mkdir(parents=True, exist_ok=True)
    args.doc.write_text(text, encoding="utf-8")
    return 0
