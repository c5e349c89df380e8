"""`gpuplan eval`: whole-model accuracy on GPU labels, leave-one-GPU-out, and the CPU closed loop.

Writes ``docs/accuracy.md``, ``docs/accuracy.json`` and the pictures
``docs/accuracy-{residuals,coverage}.png`` (see `evaluation.publishing`); ``--from-json``
renders them again from a saved JSON without measuring. The calibrated column is honest by
construction: each row is corrected only from the outcomes of *other* models (and, for
leave-one-GPU-out, other GPUs), never from itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import errors, paths, provenance
from gpuplan_estimator.core.progress import Progress, silent, track
from gpuplan_estimator.cost import roofline
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.devices import local_cpu
from gpuplan_estimator.evaluation import (
    cpu_loop,
    gpu_labels,
    host_bench,
    pages,
    publishing,
    report,
    torch_loop,
)
from gpuplan_estimator.evaluation.gpu_labels import RowResult
from gpuplan_estimator.interfaces.cli import arguments, eval_checks, output, progress, training
from gpuplan_estimator.latency import bundles, learned, selection
from gpuplan_estimator.planning import calibrating
from gpuplan_estimator.training import fitting, recipe, shared_errors

LGB = "lightgbm"
CALIBRATED = "lightgbm+calibration"
PROBED = "lightgbm+probe"


def register(subparsers: Any) -> None:
    """Add the ``eval`` subcommand to an argparse subparsers object."""
    p = subparsers.add_parser("eval", help="whole-model accuracy -> docs/accuracy.{md,json} "
                              "and docs/accuracy-*.png; `gpuplan eval CHECK` runs one of the "
                              "other evaluation checks")
    p.add_argument("--from-json", type=Path, metavar="ACCURACY_JSON",
                   help="measure nothing: render the page and pictures again from a saved "
                   "accuracy.json (e.g. docs/accuracy.json)")
    p.add_argument("--labels", type=Path, metavar="CSV",
                   help="labels.csv (default: shared model-labels)")
    p.add_argument("--bundle", type=Path, metavar="DIR",
                   help="latency model bundle (default: as `estimate`)")
    p.add_argument("--out-dir", type=Path, default=paths.REPO_ROOT / "docs", metavar="DIR",
                   help="where accuracy.md, accuracy.json and the pictures go "
                   "(default: the repo's docs/)")
    p.add_argument("--no-logo", action="store_true", help="skip leave-one-GPU-out retraining")
    p.add_argument("--no-cpu", action="store_true", help="skip the CPU closed loop")
    p.add_argument("--cpu-from", type=Path, metavar="ACCURACY_JSON",
                   help="carry the CPU closed loop (rows, host, models, provenance) over from "
                        "a saved run such as docs/accuracy.json instead of timing it: the GPU "
                        "views are re-measured, CPU timings are slow and noisy")
    p.add_argument("--cpu-runs", type=int, default=10, metavar="N",
                   help="timed runs per CPU model session (default %(default)s)")
    p.add_argument("--cpu-sessions", type=int, default=3, metavar="N",
                   help="onnxruntime sessions per CPU model; the median is kept (default 3)")
    p.add_argument("--cpu-bench-minutes", type=arguments.duration_minutes, default=10.0,
                   metavar="MINUTES",
                   help="benchmark this host first and price the CPU loop with models fitted "
                   "on its rows (resumable; minutes, or a duration like 1h); 0 = the bundle's "
                   "CPU models (default %(default)s)")
    p.add_argument("--cpu-bench-samples", type=int, default=4000, metavar="ROWS",
                   help="rows in the host's bench plan (default %(default)s)")
    p.add_argument("--cpu-bench-seed", type=int, default=0, metavar="SEED",
                   help="sampling seed of the host's bench plan (default %(default)s)")
    p.add_argument("--cpu-db", default=None, metavar="URL",
                   help="performance database for the host bench (default: as for bench)")
    p.add_argument("--no-torch", action="store_true",
                   help="skip the CPU training step (light models converted to PyTorch)")
    p.add_argument("--torch-runs", type=int, default=5, metavar="N",
                   help="timed SGD steps per model and batch (default %(default)s)")
    p.add_argument("--torch-bench-minutes", type=arguments.duration_minutes, default=10.0,
                   metavar="MINUTES",
                   help="`gpuplan bench --backend torch` budget on this host before the training "
                   "step is priced (resumable); 0 = the bundle's torch CPU models "
                   "(default %(default)s)")
    p.add_argument("--torch-bench-samples", type=int, default=1500, metavar="ROWS",
                   help="rows in the host's torch bench plan (default %(default)s)")
    p.add_argument("--logo-max-rows", type=int, default=15_000, metavar="ROWS",
                   help="subsample cap per kernel for the leave-one-GPU-out refits, in rows "
                   "(default %(default)s)")
    progress.add_flag(p)
    output.add_output_argument(p)
    p.set_defaults(func=run)
    eval_checks.register(p)


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def public_roots() -> dict[str, str]:
    """Path prefixes of this machine → how the accuracy page spells them."""
    return {f"{paths.REPO_ROOT}/": "", f"{recipe.shared_data_dir()}/": "../shared/data/"}


def _now() -> str:
    return datetime.now().astimezone().isoformat(timespec="seconds")


def run(args: argparse.Namespace) -> int:
    """`gpuplan eval`: price and measure every loop (or re-render a saved run), write docs."""
    if args.from_json is not None:
        return render_saved(args.from_json, args.out_dir, args.output)
    with progress.for_args(args) as bars:
        rep = measure(args, bars)
    return publish(rep, args.out_dir, args.output)


def publish(rep: report.Report, out_dir: Path, fmt: str) -> int:
    """Write the page, JSON and pictures; print the headline numbers as text or a document."""
    written = [str(path) for path in publishing.write(rep, out_dir, roots=public_roots())]
    for path in written:
        output.note(fmt, f"wrote {path}")
    if output.is_document(fmt):
        output.emit_document(output.document("Accuracy", {
            "written": written, "summary": summary_json(rep)}), fmt)
    else:
        print_summary(rep)
    return 0


def summary_json(rep: report.Report) -> dict[str, Any]:
    """The headline numbers of `print_summary` as data: per predictor, over all devices."""
    def as_dict(s: Any) -> dict[str, float]:
        return {"mape_pct": s.mape_pct, "p90_ape_pct": s.p90_ape_pct,
                "coverage_pct": s.coverage_pct}

    return {
        "gpu": {p: as_dict(s) for (p, d), s in report.summarise_by_device(rep.gpu).items()
                if d == "all"},
        "leave_one_gpu_out": {p: as_dict(s) for (p, d), s
                              in report.summarise_by_device(rep.logo).items() if d == "all"},
        "cpu": {k: as_dict(s) for k, s in report.summarise_cpu(rep.cpu).items()},
    }


def render_saved(source: Path, out_dir: Path, fmt: str) -> int:
    """Write the page and pictures from a saved accuracy JSON, stamped with this rendering."""
    try:
        saved = publishing.read(source)
    except (OSError, ValueError) as exc:
        raise errors.InvalidRequestError("--from-json", f"{source}: {exc}") from None
    command = shlex.join(["gpuplan", "eval", "--from-json",
                          pages_path(source, public_roots())])
    rep = dataclasses.replace(saved, rendered=report.Provenance(
        created=_now(), commit=provenance.git_commit(short=True), command=command))
    return publish(rep, out_dir, fmt)


def pages_path(path: Path, roots: Mapping[str, str]) -> str:
    """`path` as the page prints it: relative to the checkout where it lies inside it."""
    return pages.portable(str(path.resolve()), roots)


def measure(args: argparse.Namespace, bars: Progress) -> report.Report:
    """Run every loop the flags ask for and return the report (nothing is written)."""
    shared = recipe.shared_data_dir()
    labels_path = args.labels or shared / "model-labels" / "labels.csv"
    rows = gpu_labels.read_labels(labels_path)
    catalog = devices.load_catalog()
    build = gpu_labels.zoo_graph_builder(labels_path.parent / "model_configs")
    fitted, bundle_text = latency_bundle(args.bundle, shared / "gpu-ops")
    _say(f"eval: {len(rows)} label rows; latency models: {bundle_text}")
    predictors: dict[str, LatencyPredictor] = {
        "roofline": roofline.RooflinePredictor(), LGB: learned.LearnedPredictor(fitted)}
    gpu, skipped = gpu_labels.evaluate_rows(rows, predictors=predictors, catalog=catalog,
                                            build_graph=build, progress=bars)
    gpu = gpu + calibrated(gpu, hold_out_device=False)
    logo: tuple[RowResult, ...] = ()
    if not args.no_logo:
        logo = leave_one_gpu_out(rows, shared / "gpu-ops", args.logo_max_rows, catalog, build,
                                 progress=bars)
        logo = logo + calibrated(logo, hold_out_device=True)
    cpu: tuple[cpu_loop.CpuResult, ...] = ()
    host: report.Host | None = None
    cpu_models: list[report.CpuModels] = []
    cpu_measured: report.Provenance | None = None
    if args.cpu_from is not None:
        saved = saved_cpu_loop(args.cpu_from)
        cpu, host, cpu_models = saved.cpu, saved.host, list(saved.cpu_models)
        cpu_measured = saved.cpu_measured or saved.measured
    elif not args.no_cpu:
        device = local_cpu.local_cpu_device()
        host = report.Host(device.name, device.sm_count, device.peak_tflops["fp32"] * 1000,
                           device.mem_bandwidth_gbps)
        inference_models, info = host_cpu_models(
            fitted, "onnxruntime", args.cpu_bench_minutes, args.cpu_bench_samples, args, bars)
        cpu_models.append(info)
        cpu = cpu_loop.evaluate_light_models(
            device=device, predictor=inference_models,
            settings=cpu_loop.CpuTimingSettings(runs=args.cpu_runs, sessions=args.cpu_sessions),
            progress=bars)
        if not args.no_torch:
            torch_models, info = host_cpu_models(
                fitted, "torch", args.torch_bench_minutes, args.torch_bench_samples, args, bars)
            cpu_models.append(info)
            cpu += torch_loop.evaluate_training_steps(
                device=device, predictor=torch_models,
                settings=cpu_loop.CpuTimingSettings(runs=args.torch_runs), progress=bars)
    return report.Report(
        measured=report.Provenance(created=_now(), commit=provenance.git_commit(short=True),
                                   command=command_line(args, public_roots())),
        bundle=bundle_text, gpu=gpu, skipped=skipped, logo=logo, cpu=cpu,
        notes=notes(fitted), host=host, cpu_models=tuple(cpu_models), cpu_measured=cpu_measured)


def saved_cpu_loop(source: Path) -> report.Report:
    """The saved run whose CPU closed loop `--cpu-from` carries over; it must have one."""
    try:
        saved = publishing.read(source)
    except (OSError, ValueError) as exc:
        raise errors.InvalidRequestError("--cpu-from", f"{source}: {exc}") from None
    if not saved.cpu:
        raise errors.InvalidRequestError("--cpu-from", f"{source} has no CPU closed loop rows")
    return saved


def print_summary(rep: report.Report) -> None:
    """The headline numbers on stdout, one line per predictor and view."""
    for (p, d), s in report.summarise_by_device(rep.gpu).items():
        if d == "all":
            print(f"  GPU {p:22s} MAPE {s.mape_pct:5.1f} %  P90 {s.p90_ape_pct:5.1f} %"
                  f"  in P10-P90 {s.coverage_pct:3.0f} %")
    for (p, d), s in report.summarise_by_device(rep.logo).items():
        if d == "all":
            print(f"  LOGO {p:21s} MAPE {s.mape_pct:5.1f} %  P90 {s.p90_ape_pct:5.1f} %"
                  f"  in P10-P90 {s.coverage_pct:3.0f} %")
    for k, s in report.summarise_cpu(rep.cpu).items():
        print(f"  CPU {k:22s} MAPE {s.mape_pct:5.1f} %  P90 {s.p90_ape_pct:5.1f} %"
              f"  in P10-P90 {s.coverage_pct:3.0f} %")


def latency_bundle(explicit: Path | None, gpu_ops: Path) -> tuple[bundles.Bundle, str]:
    """The bundle `estimate` would use, else a fresh in-memory fit, with a description.

    The fit from the shared op data is used when the bundle cannot load (e.g. a stale feature
    schema while the shipped one awaits `make models`).
    """
    try:
        fitted = bundles.load_default(explicit)
        return fitted, (f"the {fitted.origin} bundle, trained by "
                        f"`{fitted.manifest.get('command')}`")
    except errors.BundleError as exc:
        if explicit is not None:
            raise
        _say(f"eval: {exc}; fitting latency models from {gpu_ops} in memory")
    frame = training.load_sources([str(gpu_ops)])
    fitted = fitting.train_bundle(frame, fitting.TrainSettings(), validate=False)
    return fitted, ("models fitted in memory from the gpu-ops data set with default "
                    "settings (the installed bundle could not be loaded)")


def host_cpu_models(fitted: bundles.Bundle, backend: str, minutes: float, samples: int,
                    args: argparse.Namespace, bars: Progress = silent,
                    ) -> tuple[LatencyPredictor, report.CpuModels]:
    """The models that price a CPU loop on `backend`, with where their rows came from.

    Fitted on this host's bench rows, or (with 0 minutes) the bundle's, whose rows may come
    from another host.
    """
    if minutes <= 0:
        try:
            name = selection.cpu_backend_name(fitted.manifest, backend)
        except errors.InvalidRequestError as exc:
            raise errors.InvalidRequestError(
                f"--{'cpu' if backend == 'onnxruntime' else backend}-bench-minutes",
                f"{exc.message}; benchmark this host instead") from None
        return (learned.LearnedPredictor(fitted, backend=name),
                report.CpuModels(backend=backend, source="bundle", rows=0, speed_ratio=1.0,
                                 reference_rows=0))
    models = host_bench.bench_and_fit(
        host_bench.HostBenchSettings(minutes=minutes, samples=samples, seed=args.cpu_bench_seed,
                                     db_url=args.cpu_db, backend=backend),
        progress=bars)
    _say(f"eval: {models.describe()}")
    predictor = host_bench.ScaledPredictor(learned.LearnedPredictor(models.bundle),
                                           models.speed_ratio)
    return predictor, report.CpuModels(backend=backend, source="host-bench", rows=models.rows,
                                       speed_ratio=models.speed_ratio,
                                       reference_rows=models.reference_rows)


def calibrated(results: Sequence[RowResult], *, hold_out_device: bool) -> tuple[RowResult, ...]:
    """LightGBM rows corrected from the outcomes of other models (and GPUs, if asked)."""
    learned = [r for r in results if r.predictor == LGB]
    outcomes = [calibrating.Outcome(r.device, report.group_key(r)[2], r.predicted_ms,
                                    r.row.measured_ms, model=r.row.model) for r in learned]
    out = []
    for r in learned:
        train_on = calibrating.outcomes_excluding(
            outcomes, model=r.row.model, device=r.device if hold_out_device else None)
        cal = calibrating.fit(train_on)
        c = calibrating.apply(cal, r.device, report.group_key(r)[2], r.predicted_ms, r.p10_ms,
                              r.p90_ms)
        out.append(RowResult(r.row, r.device, CALIBRATED, c.median_ms, c.p10_ms, c.p90_ms,
                             r.forward_ms * c.correction.factor))
    return tuple(out)


def leave_one_gpu_out(
    rows: Sequence[gpu_labels.LabelRow], gpu_ops: Path, max_rows: int, catalog: devices.Catalog,
    build: gpu_labels.GraphBuilder, *, progress: Progress = silent,
) -> tuple[RowResult, ...]:
    """Price each labelled GPU's rows with latency models refitted without its op rows.

    Each GPU is priced twice: unseen, and with a probe of it (`fitting.probe_rows`: what a
    short bench on a new GPU type gives).
    """
    frame = training.load_sources([str(gpu_ops)])
    settings = fitting.TrainSettings(max_rows_per_kernel=max_rows)
    keys = gpu_labels.devices_of(rows, catalog)
    fitted: dict[str, bundles.Bundle] = {}
    held_out: dict[str, dict[str, shared_errors.HeldOut]] = {}
    for key in track(keys, "eval: leave one GPU out", progress):
        fitted[key] = fitting.train_bundle(frame[frame["device"] != key], settings,
                                           validate=False)
        held_out[key] = shared_errors.transfer_predictions(fitted[key],
                                                           frame[frame["device"] == key])
    out: list[RowResult] = []
    for key in keys:
        # The interval's shared error for GPU `key` comes from the other GPUs' op rows only.
        held = shared_errors.with_shared_sigmas(fitted[key], shared_errors.pooled_sigmas(
            {k: e for k, e in held_out.items() if k != key}, seed=settings.seed))
        # The same models, corrected by a few of the left-out GPU's rows (as `train_bundle`
        # does for a GPU with fewer than `probe_max_rows` rows of a kernel).
        probe = fitting.probe_rows(frame[frame["device"] == key], settings.probe_rows,
                                   settings.seed)
        probed = fitting.with_probes(held, probe)
        mine = [r for r in rows if gpu_labels.label_device(r, catalog).key == key]
        results, _ = gpu_labels.evaluate_rows(
            mine, predictors={LGB: learned.LearnedPredictor(held),
                              PROBED: learned.LearnedPredictor(probed)},
            catalog=catalog, build_graph=build, progress=progress,
            task=f"eval: GPU label rows, {key} left out")
        out.extend(results)
    return tuple(out)


def notes(fitted: bundles.Bundle) -> tuple[str, ...]:
    """The report's fixed notes on method and splits, plus whether the bundle has CPU models."""
    has_cpu = any(str(b).startswith(("onnxruntime", "ort")) or "cpu" in str(b)
                  for b in fitted.manifest.get("backends", []))
    return (
        "Split: the GPU labels are a DEVELOPMENT set (same GPUs as the op data). Nothing is "
        "fitted to them except the calibration column, which for every row uses only the "
        "outcomes of other models (leave-one-model-out; for leave-one-GPU-out also other GPUs).",
        "Inference rows compare forward time with `fw_ms`; training rows compare forward + "
        "backward with `e2e_latency_ms` (the labels exclude the optimizer step).",
        "`/compiled` rows are torch.compile runs, priced with `framework=pytorch-compiled` "
        "(decomposed GELU/LayerNorm/softmax as one kernel, attention scale and mask inside "
        "the softmax, residual Add inside the LayerNorm; GEMMs unchanged).",
        "Intervals (`planning.intervals`): on a GPU the bundle measured, the per-layer P10/P90 "
        "of the quantile models summed; on a GPU left out, each distinct kernel shape's own "
        "spread plus the error its kernel family shares on an unseen GPU, sized per duration "
        "band of the kernel from the other GPUs' leave-one-GPU-out op rows (never from these "
        "labels). The roofline has none.",
        "Leave one GPU out, `lightgbm+probe`: the same refit plus a probe of the left-out GPU:"
        " 20 of its op rows per kernel, one from each twentieth of the kernel's sizes "
        "(`training.fitting.probe_rows`, as `gpuplan bench`'s log-uniform sweeps spread them): "
        "the transfer model corrected per kernel (log offset + bounded slope on log base_ms, "
        "flat beyond the probed sizes), as `gpuplan train` "
        "does after a short `gpuplan bench` on a new GPU type. It uses measurements of that GPU, "
        "so it is not the spec-sheet-only case (`lightgbm`). It pulls predictions toward the "
        "GPU's own op data, which on T4 runs large GEMMs slower than its whole-model labels imply"
        " (linear rows with M 2-8k, N and K 0.7-5k: median 3.3 TFLOP/s; the BERT-large batch-8 "
        "label runs its 2.94 TFLOP of GEMMs in under 694 ms, at least 4.2), hence the T4 rows.",
        "CPU: " + ("the bundle has CPU op models (onnxruntime backend)."
                   if has_cpu else
                   "the bundle has no CPU latency model, so CPU items fall back to the "
                   "roofline of the calibrated host (labelled `roofline:*`)."),
        "CPU training step: the light models onnx2torch converts (weights made random, "
        "batch-norm in training mode), one SGD step (forward, mean loss, backward, step) "
        "timed in PyTorch eager; priced with `framework=pytorch-eager`, mode train, optimizer "
        "sgd, on CPU models fitted from this host's `gpuplan bench --backend torch` rows "
        "(forward-shaped kernels; backward derived as for GPUs).",
        "CPU loop is priced with `framework=onnxruntime` (its default graph fusions: "
        "BatchNorm folded into conv weights, Conv/Gemm+activation and MatMul+bias as one "
        "kernel, decomposed GELU/LayerNorm/softmax as one kernel; convs in NCHWc chains "
        "without the layout reorders their single-node rows include); GPU rows with "
        "`pytorch-eager` (one kernel per node, as the op data was measured).",
        "Elementwise ops count only full-size inputs as operands: a broadcast bias or "
        "attention mask is priced like the scalar of a tensor-scalar op.",
        "CPU op data: the measurement files in `estimator/gpuplan_estimator/data/"
        "cpu-measurements`; the JSON beside each records how and where it was measured.",
    )


def command_line(args: argparse.Namespace, roots: Mapping[str, str]) -> str:
    """The `gpuplan eval` command line that reproduces this run, shell-quoted, with the paths
    under `roots` spelled as the page spells them."""
    parts = ["gpuplan", "eval"]
    for flag in ("labels", "bundle"):
        if getattr(args, flag) is not None:
            parts += [f"--{flag}", pages_path(getattr(args, flag), roots)]
    parts += ["--no-logo"] if args.no_logo else ["--logo-max-rows", str(args.logo_max_rows)]
    if args.cpu_from is not None:
        return shlex.join([*parts, "--cpu-from", pages_path(args.cpu_from, roots)])
    parts += ["--no-cpu"] if args.no_cpu else [
        "--cpu-runs", str(args.cpu_runs), "--cpu-sessions", str(args.cpu_sessions),
        "--cpu-bench-minutes", f"{args.cpu_bench_minutes:g}",
        "--cpu-bench-samples", str(args.cpu_bench_samples),
        "--cpu-bench-seed", str(args.cpu_bench_seed),
        *(["--cpu-db", args.cpu_db] if args.cpu_db else []),
        *(["--no-torch"] if args.no_torch else [
            "--torch-runs", str(args.torch_runs),
            "--torch-bench-minutes", f"{args.torch_bench_minutes:g}",
            "--torch-bench-samples", str(args.torch_bench_samples)])]
    return shlex.join(parts)
