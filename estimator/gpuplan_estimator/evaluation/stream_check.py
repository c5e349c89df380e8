"""The stream's kernel time against what a profiler saw (issue #30).

    gpuplan eval stream-check --steps docs/gpu-steps/2026-11-27-h200b/steps.jsonl [--bundle DIR]

`model_steps` profiles one step of each case it instruments (`instrumented.<phase>.kernels`:
per kernel name, count and time). Their sum over GPU kernels (the CUDA runtime's own calls
left out) is the stream's busy time of that phase, the figure `estimates.stream_busy_ms`
predicts. Nothing is fitted here: it checks the kernel side of the two clocks apart from the
host's.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.evaluation import host_check, model_step_scoring, model_steps
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates

PHASES = ("forward", "backward")
HOST_SIDE_PREFIXES = ("cuda", "cu", "Activity")
"""Profiler rows of the CUDA runtime and driver (cudaLaunchKernel, cudaDeviceSynchronize,
cuLaunchKernelEx, the profiler's "Activity Buffer Request"): host calls, not kernels."""


def profiled_kernel_ms(row: Mapping[str, Any], phase: str) -> float | None:
    """The GPU kernels' time of one profiled phase (ms), if the row was instrumented."""
    kernels = ((row.get("instrumented") or {}).get(phase) or {}).get("kernels")
    if not kernels:
        return None
    if kernels.get("rest", {}).get("count", 0):
        return None  # names beyond the top list: their split into kernels and calls is unknown
    return sum(float(k["us"]) for k in kernels.get("top", [])
               if not str(k["name"]).startswith(HOST_SIDE_PREFIXES)) / 1000.0


@dataclass(frozen=True)
class StreamCheckSettings:
    """`gpuplan eval stream-check`'s flags."""
    steps: tuple[Path, ...]
    bundle: str | None


def compare(lines: Sequence[Mapping[str, Any]], predictor: Any,
            device: devices.DeviceSpec) -> list[dict[str, Any]]:
    """Per instrumented row and phase: predicted stream time against the profiled sum."""
    cases = {c.name: c for set_ in model_steps.CASE_SETS.values() for c in set_}
    cache: dict[tuple[str, int], Any] = {}
    out = []
    for row in host_check.ok_rows(lines):
        measured = [profiled_kernel_ms(row, p) for p in PHASES]
        if all(m is None for m in measured):
            continue
        g = host_check.case_graph(cases[row["model"]], row, cache)
        busy = estimates.stream_busy_ms(g, device, host_check.train_settings(row),
                                        predictor=predictor)
        for phase, predicted, profiled in zip(PHASES, busy, measured, strict=False):
            if profiled:
                out.append({"model": row["model"], "batch": int(row["batch"]),
                            "precision": model_step_scoring.estimator_precision(row),
                            "phase": phase, "predicted_ms": predicted, "profiled_ms": profiled,
                            "error_pct": 100.0 * (predicted / profiled - 1.0)})
    return out


def run(settings: StreamCheckSettings) -> int:
    """Print each phase's predicted and profiled kernel time, and the MAPE per precision."""
    predictor, source = selection.select_predictor(settings.bundle, None)
    rows: list[dict[str, Any]] = []
    for path in settings.steps:
        lines = model_step_scoring.read_json_lines(path)
        rows += compare(lines, predictor, host_check.run_device(lines, path))
    print(f"predictor: {source}")
    print("| model | batch | precision | phase | predicted ms | profiled ms | error % |")
    print("|---|--:|---|---|--:|--:|--:|")
    for r in rows:
        print(f"| {r['model']} | {r['batch']} | {r['precision']} | {r['phase']} | "
              f"{r['predicted_ms']:.1f} | {r['profiled_ms']:.1f} | {r['error_pct']:+.1f} |")
    for precision in sorted({r["precision"] for r in rows}):
        errors = [abs(r["error_pct"]) for r in rows if r["precision"] == precision]
        print(f"{precision}: MAPE {statistics.fmean(errors):.1f} % over {len(errors)} phases")
    return 0 if rows else 1
