"""`gpuplan eval CHECK ...`: the evaluation checks `make` runs, one argparse home for them.

`gpuplan eval` alone is the accuracy evaluation (`interfaces.cli.evaluation`); each check named
after it parses its flags here and calls its module's `run` with typed settings:

- ``plans-report``: plans for GPT-class models -> docs/plans.md (`evaluation.plans_report`)
- ``speed``: how fast `estimate` itself is (`evaluation.speed`)
- ``memory-check``: predicted vs measured training memory on CPU (`evaluation.memory_check`)
- ``parallel-check``: the DP/TP/PP step model vs published steps (`evaluation.parallel_check`)
- ``model-step-scoring predict|score``: whole-model steps, priced before they are measured and
  scored after (`evaluation.model_step_scoring`)
- ``host-check``: the host timeline fitted leave-one-model-out (`evaluation.host_check`)
- ``stream-check``: predicted stream time against profiled kernel sums
  (`evaluation.stream_check`)
- ``sub-wave-check``: GEMM one-wave scaling held out per GPU (`evaluation.sub_wave_check`)
- ``transfer-check``: leave-one-GPU-out of a transfer structure (`evaluation.transfer_check`)

`evaluation.model_steps` keeps its own entry point: the GPU campaign runs it on a bare device
with PyTorch only (`hack/gpu_campaign.sh`), where this command line's imports are not installed.

A bad flag is a usage error naming it (exit 2, `exits`).
"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from gpuplan_estimator.cost import features
from gpuplan_estimator.evaluation import (
    host_check,
    memory_check,
    model_step_scoring,
    model_steps,
    parallel_check,
    plans_report,
    speed,
    stream_check,
    sub_wave_check,
    transfer_check,
)
from gpuplan_estimator.interfaces import json_documents

CHECKS = ("plans-report", "speed", "memory-check", "parallel-check", "model-step-scoring",
          "host-check", "stream-check", "sub-wave-check", "transfer-check")
"""The checks `gpuplan eval` runs by name (a test keeps this list and the parser in step)."""


def register(eval_parser: argparse.ArgumentParser) -> None:
    """Add the checks as optional subcommands of `gpuplan eval`."""
    checks = eval_parser.add_subparsers(
        dest="check", metavar="CHECK", title="checks (instead of the accuracy evaluation)")
    for add in (_plans_report, _speed, _memory_check, _parallel_check, _model_step_scoring,
                _host_check, _stream_check, _sub_wave_check, _transfer_check):
        add(checks)


def _plans_report(checks: Any) -> None:
    p = checks.add_parser("plans-report", help="plans for GPT-2 medium, GPT-3 2.7B, LLaMA-7B "
                          "over A100/H100/L4 pools -> docs/plans.md (~30 s)",
                          description=plans_report.__doc__)
    p.add_argument("--out", type=Path, default=plans_report.DEFAULT_OUT,
                   help="page to write (default docs/plans.md; plans.json beside it)")
    p.set_defaults(func=lambda args: plans_report.run(
        plans_report.PlansReportSettings(out=args.out),
        document=lambda answer: json_documents.planned_json(answer, max_candidates=None)))


def _speed(checks: Any) -> None:
    p = checks.add_parser("speed", help="speed of `estimate` itself (reported, not asserted)",
                          description=speed.__doc__)
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--repeats", type=int, default=3,
                   help="timed `estimate` calls per case; the median is kept (default 3)")
    p.add_argument("--gpt2-config", type=Path, default=speed.GPT2_LARGE_CONFIG,
                   help="Hugging Face config of the GPT-2 large case (default: the shipped one)")
    p.set_defaults(func=lambda args: speed.run(speed.SpeedSettings(
        json=args.json, repeats=args.repeats, gpt2_config=args.gpt2_config)))


def _memory_check(checks: Any) -> None:
    p = checks.add_parser("memory-check", help="predicted vs measured per-component training "
                          "memory (PyTorch on CPU, ~10 s)",
                          description="Predicted vs measured per-component memory of small CPU "
                          "training steps.")
    p.set_defaults(func=lambda args: memory_check.run())


def _parallel_check(checks: Any) -> None:
    p = checks.add_parser("parallel-check", help="DP/TP/PP step model vs published 4-GPU steps",
                          description=parallel_check.__doc__)
    p.add_argument("--bundle", default=None, metavar="DIR",
                   help="model bundle to predict with (default: as `gpuplan estimate`)")
    p.set_defaults(func=lambda args: parallel_check.run(
        parallel_check.ParallelCheckSettings(bundle=args.bundle)))


def _model_step_scoring(checks: Any) -> None:
    parent = checks.add_parser("model-step-scoring", help="whole-model steps: price the GPU "
                               "campaign's cases (predict), score them once measured (score)",
                               description=model_step_scoring.__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parent.add_subparsers(dest="half", metavar="predict|score", required=True)
    p = sub.add_parser("predict", help="price the campaign's cases before they are measured")
    p.add_argument("--device", action="append", required=True, help="catalog device (repeat)")
    p.add_argument("--precisions", default=",".join(model_step_scoring.PREDICTED_PRECISIONS),
                   help="comma-separated precisions to price (default %(default)s)")
    p.add_argument("--cases", choices=sorted(model_steps.CASE_SETS), default="full",
                   help="the campaign's case set (smoke: the tiny models a CPU rehearsal runs)")
    p.add_argument("--models", default="", help="comma-separated case names (default all)")
    p.add_argument("--bundle", default=None, help="model bundle directory (default: active)")
    p.add_argument("--out", type=Path, required=True, metavar="JSON",
                   help="where the predictions go, with their provenance")
    p.add_argument("--host-folds", type=Path, default=None,
                   help="JSON of case -> host model fitted without it (host-check --folds)")
    p.add_argument("--aligned-folds", type=Path, default=None,
                   help="JSON of case -> aligned-GEMM utilisation fitted without it "
                        "(stream-check --folds)")
    spread = p.add_mutually_exclusive_group()
    spread.add_argument("--step-folds", type=Path, default=None,
                        help="JSON of case -> step-level spread fitted without it "
                             "(hack/bundle_step_spread.py --folds); default: the bundle's")
    spread.add_argument("--no-step-spread", action="store_true",
                        help="intervals from the kernels and host alone (what the step-level "
                             "spread is fitted on)")
    p.set_defaults(func=_predict)
    s = sub.add_parser("score", help="join predictions with a model_steps measurement")
    s.add_argument("--predicted", type=Path, required=True, metavar="JSON",
                   help="the predictions `predict` wrote")
    s.add_argument("--measured", type=Path, required=True, metavar="JSONL",
                   help="the campaign's measured steps (`model_steps` JSON lines)")
    s.add_argument("--markdown", type=Path, default=None, help="also write the tables here")
    s.set_defaults(func=lambda args: model_step_scoring.run_score(
        model_step_scoring.ScoreSettings(predicted=args.predicted, measured=args.measured,
                                         markdown=args.markdown)))


def _host_check(checks: Any) -> None:
    p = checks.add_parser("host-check", help="the host timeline against measured steps, "
                          "leave-one-model-out", description=host_check.__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=Path, action="append", required=True,
                   help="model_steps JSON lines (repeat)")
    p.add_argument("--event-steps", type=Path, action="append", default=[],
                   help="model_steps JSON lines of a run without host clocks (repeat): its "
                        "host-bound phases' event times stand for the host's")
    p.add_argument("--probe", type=Path, required=True, help="bench.host_probe JSON")
    p.add_argument("--json", type=Path, default=None, help="write the host model here")
    p.add_argument("--folds", type=Path, default=None,
                   help="write each model's leave-one-out host model here "
                        "(model-step-scoring predict --host-folds)")
    p.set_defaults(func=lambda args: host_check.run(host_check.HostCheckSettings(
        steps=tuple(args.steps), probe=args.probe, json=args.json, folds=args.folds,
        event_steps=tuple(args.event_steps))))


def _stream_check(checks: Any) -> None:
    p = checks.add_parser("stream-check", help="predicted stream time against the kernel sums "
                          "of profiled steps", description=stream_check.__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=Path, action="append", required=True,
                   help="model_steps JSON lines with instrumented phases (repeat)")
    p.add_argument("--bundle", default=None, help="model bundle (default: the shipped one)")
    p.add_argument("--folds", type=Path, default=None,
                   help="fit the aligned-GEMM utilisation leaving each model out, write the "
                        "folds here (model-step-scoring predict --aligned-folds) and price "
                        "each model with its own")
    p.set_defaults(func=lambda args: stream_check.run(stream_check.StreamCheckSettings(
        steps=tuple(args.steps), bundle=args.bundle, folds=args.folds)))


def _sub_wave_check(checks: Any) -> None:
    p = checks.add_parser("sub-wave-check", help="GEMM one-wave scaling, each GPU held out",
                          description=sub_wave_check.__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--max-rows", type=int, default=15000, help="gemm rows (default 15000)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the row subsample and the fits (default %(default)s)")
    p.add_argument("--bench", type=Path, action="append", default=[],
                   help="a `gpuplan bench --export` parquet; its GPU is left out like the rest")
    p.set_defaults(func=lambda args: sub_wave_check.run(sub_wave_check.SubWaveCheckSettings(
        max_rows=args.max_rows, seed=args.seed, bench=tuple(args.bench))))


def _transfer_check(checks: Any) -> None:
    p = checks.add_parser("transfer-check", help="leave-one-GPU-out of a transfer structure",
                          description=transfer_check.__doc__,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=features.TRANSFER_KINDS, default="tiled",
                   help="transfer structure to check (default %(default)s)")
    p.add_argument("--max-rows", type=int, default=3000, help="rows per kernel (default 3000)")
    p.add_argument("--op-max-rows", type=int, default=8000,
                   help="rows per kernel of the op-family table (default 8000)")
    p.add_argument("--kernels", default=",".join(transfer_check.OP_KERNELS),
                   help="op families, comma-separated")
    p.add_argument("--no-ops", action="store_true", help="skip the op-family table")
    p.add_argument("--no-models", action="store_true", help="skip the whole-model table")
    p.add_argument("--probe-seed", type=int, default=None,
                   help="seed of the probe rows' draw (default: the training seed, 0)")
    p.set_defaults(func=lambda args: transfer_check.run(transfer_check.TransferCheckSettings(
        kind=args.kind, max_rows=args.max_rows, op_max_rows=args.op_max_rows,
        kernels=tuple(args.kernels.split(",")), ops=not args.no_ops, models=not args.no_models,
        probe_seed=args.probe_seed)))


def _predict(args: argparse.Namespace) -> int:
    settings = model_step_scoring.PredictSettings(
        devices=tuple(args.device), precisions=_names(args.precisions), cases=args.cases,
        models=_names(args.models), bundle=args.bundle, out=args.out,
        host_folds=args.host_folds, aligned_folds=args.aligned_folds,
        step_folds=args.step_folds, no_step_spread=args.no_step_spread)
    return model_step_scoring.run_predict(settings, command=predict_command(settings))


def predict_command(settings: model_step_scoring.PredictSettings) -> str:
    """The command line that reproduces a prediction, as its provenance records it."""
    parts = ["gpuplan", "eval", "model-step-scoring", "predict"]
    for device in settings.devices:
        parts += ["--device", device]
    parts += ["--precisions", ",".join(settings.precisions), "--cases", settings.cases]
    if settings.models:
        parts += ["--models", ",".join(settings.models)]
    if settings.bundle is not None:
        parts += ["--bundle", settings.bundle]
    parts += ["--out", str(settings.out)]
    if settings.host_folds is not None:
        parts += ["--host-folds", str(settings.host_folds)]
    if settings.aligned_folds is not None:
        parts += ["--aligned-folds", str(settings.aligned_folds)]
    if settings.step_folds is not None:
        parts += ["--step-folds", str(settings.step_folds)]
    if settings.no_step_spread:
        parts.append("--no-step-spread")
    return shlex.join(parts)


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated flag's names, empty ones left out."""
    return tuple(name for name in text.split(",") if name)
