"""The stream's kernel time against what a profiler saw (issue #30).

    gpuplan eval stream-check --steps docs/gpu-steps/2026-11-27-h200b/steps.jsonl [--bundle DIR] \
        [--folds FOLDS.json]

`model_steps` profiles one step of each case it instruments (`instrumented.<phase>.kernels`:
per kernel name, count and time). Their sum over GPU kernels (the CUDA runtime's own calls
left out) is the stream's busy time of that phase, the figure `estimates.stream_busy_ms`
predicts. It checks the kernel side of the two clocks apart from the host's.

The same profiles teach what the kernel benchmarks cannot: how fast the tensor-core GEMMs they
miss run, aligned ones and vocabulary-sized heads (`cost.aligned_gemm`, `aligned_rows`, fitted
by `training.stream_fit`). With ``--folds`` the fit leaving each model out is written per
model, for `model-step-scoring predict --aligned-folds`, and the check prices each model with
its own fold; without it nothing is fitted here and the bundle's fit prices every model.

Then each phase again per kernel class (`class_rows`: GEMMs, a fused attention core, the
elementwise kernels TensorIterator runs unrolled, casts, norms, ...), the plan's kernels and
time beside the profile's, which is where a phase's miss is found.
"""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gpuplan_estimator import devices
from gpuplan_estimator.core import workload
from gpuplan_estimator.core.vocabulary import CAST_OP
from gpuplan_estimator.core.workload import Phase, WorkItem
from gpuplan_estimator.cost import aligned_gemm, features, tiling
from gpuplan_estimator.evaluation import host_check, model_step_scoring, model_steps
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates
from gpuplan_estimator.step.decomposition import build_step
from gpuplan_estimator.training import stream_fit

PHASES = (aligned_gemm.FORWARD, aligned_gemm.BACKWARD)
def profiled_gemm_ms(row: Mapping[str, Any], phase: str, mode: str, dtype: str
                     ) -> dict[str, float] | None:
    """Per tensor-core kernel class (`stream_fit.kernel_class`), the GEMM kernels' time of one
    profiled phase (ms); None unless the row was instrumented and its top list holds every
    kernel."""
    kernels = ((row.get("instrumented") or {}).get(phase) or {}).get("kernels")
    if not kernels or kernels.get("rest", {}).get("count", 0):
        return None
    out: dict[str, float] = {}
    for k in kernels.get("top", []):
        cls = stream_fit.kernel_class(str(k["name"]), mode, dtype)
        if cls:
            out[cls] = out.get(cls, 0.0) + float(k["us"]) / 1000.0
    return out


_PHASE_OF = {Phase.FORWARD: aligned_gemm.FORWARD, Phase.BACKWARD: aligned_gemm.BACKWARD}


def _classified_gemms(items: Sequence[WorkItem], device: devices.DeviceSpec
                      ) -> list[tuple[WorkItem, str, bool, float]]:
    """The step's forward and backward GEMMs outside a fused attention core (those run inside
    its own kernel), each with its tensor-core class, whether `aligned_gemm` prices it
    (`aligned_gemm.priced_classes`) and its tile-and-wave time (ms)."""
    gemms = [it for it in items if it.kernel == "gemm" and it.phase in _PHASE_OF
             and workload.FUSED_IO_BYTES not in it.attributes]
    if not gemms:
        return []
    cols = features.columns_from_items("gemm", gemms)
    dev = features.broadcast_device(device, cols.dtype, 0, "gemm", cols.math)
    classes, plan_ms = features.tensor_core_gemm(cols, dev)
    priced = aligned_gemm.priced_classes(classes, cols)
    return [(it, str(c), bool(ok), float(ms))
            for it, c, ok, ms in zip(gemms, classes, priced, plan_ms, strict=True)]


def _in_mode(cls: str, mode: str) -> bool:
    return bool(cls) and cls.split("-")[0] == mode


def gemm_plan_ms(items: Sequence[WorkItem], device: devices.DeviceSpec, mode: str
                 ) -> dict[tuple[str, str], float]:
    """Per (phase, tensor-core class), the tile-and-wave time (ms) of the step's GEMMs in
    `mode` that `aligned_gemm` prices."""
    return _plans_by_class(_classified_gemms(items, device), mode)[0]


def _plans_by_class(classified: Sequence[tuple[WorkItem, str, bool, float]], mode: str
                    ) -> tuple[dict[tuple[str, str], float], set[tuple[str, str]]]:
    """Of `_classified_gemms` in `mode`: the plans (ms) per (phase, class) of those
    `aligned_gemm` prices, and the (phase, class) pairs holding one it leaves to the bundle
    model (the profile sums every kernel of a class, so such a pair's ratio would not be the
    priced GEMMs')."""
    plans: dict[tuple[str, str], float] = {}
    unpriced: set[tuple[str, str]] = set()
    for it, cls, ok, ms in classified:
        if not _in_mode(cls, mode):
            continue
        key = (_PHASE_OF[it.phase], cls)
        if ok:
            plans[key] = plans.get(key, 0.0) + ms * it.count
        else:
            unpriced.add(key)
    return plans, unpriced


_MODE_OF_PRECISION = {"tf32": ("tf32", "float32"), "bf16": (tiling.HALF_MODE, "bfloat16"),
                      "fp16": (tiling.HALF_MODE, "float16")}


def aligned_rows(lines: Sequence[Mapping[str, Any]], device: devices.DeviceSpec
                 ) -> list[stream_fit.AlignedRow]:
    """Per instrumented tf32/bf16/fp16 row, phase and tensor-core class: the plans of the GEMMs
    `aligned_gemm` prices against the profiled kernels of that class (`stream_fit.AlignedRow`).
    A class whose kernels ran GEMMs it does not price (small unaligned ones) has no row."""
    cases = {c.name: c for set_ in model_steps.CASE_SETS.values() for c in set_}
    cache: dict[tuple[str, int], Any] = {}
    out = []
    for row in host_check.ok_rows(lines):
        precision = model_step_scoring.estimator_precision(row)
        if precision not in _MODE_OF_PRECISION or not row.get("instrumented"):
            continue
        mode, dtype = _MODE_OF_PRECISION[precision]
        g = host_check.case_graph(cases[row["model"]], row, cache)
        items = build_step(g, host_check.train_settings(row)).items
        plans, unpriced = _plans_by_class(_classified_gemms(items, device), mode)
        for phase in PHASES:
            profiled = profiled_gemm_ms(row, phase, mode, dtype) or {}
            for cls, ms in sorted(profiled.items()):
                plan = plans.get((phase, cls), 0.0)
                if ms > 0 and plan > 0 and (phase, cls) not in unpriced:
                    out.append(stream_fit.AlignedRow(row["model"], cls, phase, plan, ms))
    return out


def _print_aligned(rows: Sequence[stream_fit.AlignedRow],
                   folds: Mapping[str, aligned_gemm.AlignedGemmFit]) -> None:
    """Each profiled phase's aligned GEMMs: plan, profiled, and the price under the fold
    without its model, over the profiled time."""
    print("| model | class | phase | plan ms | profiled ms | held-out price / profiled |")
    print("|---|---|---|--:|--:|--:|")
    for r in rows:
        fold = folds.get(r.group)
        log_util = fold.log_util_of(r.kernel_class, r.phase) if fold is not None else np.nan
        ratio = (f"{r.plan_ms * np.exp(-log_util) / r.profiled_ms:.2f}"
                 if np.isfinite(log_util) else "-")
        print(f"| {r.group} | {r.kernel_class} | {r.phase} | {r.plan_ms:.2f} | "
              f"{r.profiled_ms:.2f} | {ratio} |")


PROFILED_CLASSES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern, re.IGNORECASE)) for name, pattern in (
        ("attention", r"fmha|sdpa|flash|attention|cudnn::fusion"),
        ("conv2d", r"implicit_gemm|conv2d|convolution|winograd"),
        ("gemm", r"gemm|nvjet|cutlass|xmma|cublas|splitKreduce"),
        ("layernorm", r"layer_norm|GammaBeta"),
        ("batchnorm", r"batch_norm|batchnorm|bn_"),
        ("softmax", r"softmax"),
        ("pool", r"pool"),
        ("reduce", r"reduce_kernel"),
        ("unrolled", r"unrolled_elementwise_kernel"),
        ("cast", r"bfloat16_copy|float16_copy"),
        ("memcpy", r"embedding|gather|scatter|index|Memcpy"),
        ("elementwise", r"elementwise|CatArray|dropout|masked_scale|Fill"),
    ))
"""Kernel classes of a profiler's kernel names, first match wins (`profiled_class`): the
classes `plan_class` puts the plan's items in, so the two can be set side by side."""


def profiled_class(name: str) -> str:
    """The class of a profiled kernel by its name (`PROFILED_CLASSES`; "other" when none)."""
    return next((cls for cls, pattern in PROFILED_CLASSES if pattern.search(name)), "other")


def plan_class(item: WorkItem) -> str:
    """The class of a planned kernel: its kernel family, a fused attention core's GEMMs apart,
    and an elementwise item as `unrolled` (`workload.DYNAMIC_CAST`), `cast` or neither."""
    if item.kernel == "gemm":
        return "attention" if workload.FUSED_IO_BYTES in item.attributes else "gemm"
    if item.kernel == "elementwise":
        if item.attributes.get(workload.DYNAMIC_CAST):
            return "unrolled"
        return "cast" if item.op == CAST_OP else "elementwise"
    return item.kernel


@dataclass(frozen=True)
class Planned:
    """An instrumented row, its profiled phases, and its step's plan on the stream."""

    row: Mapping[str, Any]
    phases: tuple[str, ...]
    """The `PHASES` whose profile holds every kernel (`host_check.profiled_kernel_ms`)."""
    stream: list[estimates.StreamRow]


def planned(lines: Sequence[Mapping[str, Any]], predictor: Any,
            device: devices.DeviceSpec) -> list[Planned]:
    """The instrumented rows of `lines` with their plans (each case's graph built once)."""
    cases = {c.name: c for set_ in model_steps.CASE_SETS.values() for c in set_}
    cache: dict[tuple[str, int], Any] = {}
    out = []
    for row in host_check.ok_rows(lines):
        phases = tuple(p for p in PHASES if host_check.profiled_kernel_ms(row, p) is not None)
        if phases:
            g = host_check.case_graph(cases[row["model"]], row, cache)
            out.append(Planned(row, phases, estimates.stream_rows(
                g, device, host_check.train_settings(row), predictor=predictor)))
    return out


def compare(lines: Sequence[Mapping[str, Any]], predictor: Any,
            device: devices.DeviceSpec) -> list[dict[str, Any]]:
    """Per instrumented row and phase: predicted stream time against the profiled sum."""
    return phases_of(planned(lines, predictor, device))


def phases_of(rows: Sequence[Planned]) -> list[dict[str, Any]]:
    """`compare` of rows already planned."""
    out = []
    for p in rows:
        for phase in p.phases:
            predicted = sum(r.ms for r in p.stream if r.phase.value == phase)
            profiled = host_check.profiled_kernel_ms(p.row, phase)
            if profiled:
                out.append({"model": p.row["model"], "batch": int(p.row["batch"]),
                            "precision": model_step_scoring.estimator_precision(p.row),
                            "phase": phase, "predicted_ms": predicted, "profiled_ms": profiled,
                            "error_pct": 100.0 * (predicted / profiled - 1.0)})
    return out


def class_rows(lines: Sequence[Mapping[str, Any]], predictor: Any,
               device: devices.DeviceSpec) -> list[dict[str, Any]]:
    """Per instrumented row, phase and kernel class: the plan's kernels and time on the
    stream against the profile's (a phase whose profile is truncated is left out)."""
    return classes_of(planned(lines, predictor, device))


def classes_of(rows: Sequence[Planned]) -> list[dict[str, Any]]:
    """`class_rows` of rows already planned."""
    out = []
    for p in rows:
        for phase in p.phases:
            plan_n: defaultdict[str, float] = defaultdict(float)
            plan_ms: defaultdict[str, float] = defaultdict(float)
            prof_n: defaultdict[str, float] = defaultdict(float)
            prof_ms: defaultdict[str, float] = defaultdict(float)
            for r in p.stream:
                if r.phase.value == phase:
                    plan_n[plan_class(r.item)] += r.kernels
                    plan_ms[plan_class(r.item)] += r.ms
            for k in p.row["instrumented"][phase]["kernels"]["top"]:
                if not host_check.RUNTIME_CALL.match(str(k["name"])):
                    prof_n[profiled_class(str(k["name"]))] += float(k["count"])
                    prof_ms[profiled_class(str(k["name"]))] += float(k["us"]) / 1000.0
            out += [{"model": p.row["model"], "precision":
                     model_step_scoring.estimator_precision(p.row), "phase": phase,
                     "class": cls, "plan_kernels": plan_n[cls], "plan_ms": plan_ms[cls],
                     "profiled_kernels": prof_n[cls], "profiled_ms": prof_ms[cls]}
                    for cls in sorted({*plan_n, *prof_n})]
    return out


@dataclass(frozen=True)
class StreamCheckSettings:
    """`gpuplan eval stream-check`'s flags."""
    steps: tuple[Path, ...]
    bundle: str | None
    folds: Path | None = None
    """Where to write each model's leave-one-out aligned-GEMM fit (None: nowhere)."""


def run(settings: StreamCheckSettings) -> int:
    """Print each phase's predicted and profiled kernel time, and the MAPE per precision;
    with `settings.folds`, fit the aligned-GEMM utilisation leaving each model out, write the
    folds and price each model with its own."""
    predictor, source = selection.select_predictor(settings.bundle, None)
    runs = [(model_step_scoring.read_json_lines(path), path) for path in settings.steps]
    folds: dict[str, aligned_gemm.AlignedGemmFit] = {}
    if settings.folds is not None:
        aligned = [r for lines, path in runs
                   for r in aligned_rows(lines, host_check.run_device(lines, path))]
        folds = stream_fit.leave_one_group_out(aligned)
        settings.folds.write_text(json.dumps({g: f.to_json() for g, f in folds.items()},
                                             indent=2) + "\n")
        for g, f in folds.items():
            print(f"fold without {g}: " + ", ".join(
                f"{m} utilisation {np.exp(v):.2f}" for m, v in f.log_util.items()))
        _print_aligned(aligned, folds)
    rows: list[dict[str, Any]] = []
    classes: list[dict[str, Any]] = []
    for lines, path in runs:
        device = host_check.run_device(lines, path)
        for model in sorted({str(r.get("model")) for r in host_check.ok_rows(lines)}):
            priced = predictor
            if model in folds and hasattr(predictor, "with_aligned_gemm"):
                priced = predictor.with_aligned_gemm(folds[model])
            mine = planned([r for r in lines if r.get("model") == model], priced, device)
            rows += phases_of(mine)
            classes += classes_of(mine)
    print(f"predictor: {source}" + (" (aligned GEMMs: each model's held-out fold)"
                                    if settings.folds is not None else ""))
    print("| model | batch | precision | phase | predicted ms | profiled ms | error % |")
    print("|---|--:|---|---|--:|--:|--:|")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['precision']} | {r['phase']} | "
              f"{r['predicted_ms']:.1f} | {r['profiled_ms']:.1f} | {r['error_pct']:+.1f} |")
    for precision in sorted({r["precision"] for r in rows}):
        errors = [abs(r["error_pct"]) for r in rows if r["precision"] == precision]
        print(f"{precision}: MAPE {statistics.fmean(errors):.1f} % over {len(errors)} phases")
    _print_classes(classes)
    return 0 if rows else 1


def _print_classes(rows: Sequence[Mapping[str, Any]]) -> None:
    print("\nPer kernel class (`plan_class`, `profiled_class`), priced as above:")
    print("| model | precision | phase | class | plan kernels | plan ms | profiled kernels "
          "| profiled ms |")
    print("|---|---|---|---|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['model']} | {r['precision']} | {r['phase']} | {r['class']} | "
              f"{r['plan_kernels']:.0f} | {r['plan_ms']:.2f} | {r['profiled_kernels']:.0f} | "
              f"{r['profiled_ms']:.2f} |")
