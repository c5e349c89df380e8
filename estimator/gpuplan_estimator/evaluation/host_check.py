"""The host timeline against measured steps: fit leave-one-model-out, report held out.

    gpuplan eval host-check \\
        --steps docs/gpu-steps/2026-11-27-h200b/steps.jsonl \\
        --probe docs/gpu-steps/2026-11-27-h200b/host-probe.json [--json host-model.json]

For every measured case (`model_steps` rows with host times), the estimator's own work items of
that case (`model_step_scoring.case_graph`, the attention it ran) give the host regressors of
`training.host_fit`; the coefficients are fitted leave-one-model-out and each model's host
time is predicted by the fold that never saw it. `--json` writes the all-rows fit with its
held-out spread and the probe, the object a bundle's manifest holds (`step.host`).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gpuplan_estimator.core import precisions
from gpuplan_estimator.core.workload import Phase
from gpuplan_estimator.evaluation import model_step_scoring, model_steps
from gpuplan_estimator.step import host
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step
from gpuplan_estimator.training import host_fit

_PHASE_NAMES = ("forward", "backward", "optimizer")


def probe_of(doc: Mapping[str, Any]) -> host.HostProbe:
    """The `HostProbe` of a `bench.host_probe` JSON document, its source named."""
    source = (f"{doc.get('cpu_model', '?')} ({doc.get('cpu_count', '?')} CPUs), "
              f"torch {doc.get('torch', '?')}, {doc.get('device_name', doc.get('device'))}, "
              f"{doc.get('date', '?')}")
    return host.HostProbe.from_figures(doc["figures_us"], source)


def _unit(name: str) -> host.HostCoefficients:
    """Coefficients with only `name` at 1 (the model is linear in each)."""
    values = {f.name: 0.0 for f in fields(host.HostCoefficients)}
    values.update({name: 1.0, "autocast_backward": 1.0})
    return host.HostCoefficients(**values)


def host_row(case: model_steps.ModelCase, row: Mapping[str, Any], probe: host.HostProbe,
             graph_cache: dict[tuple[str, int], Any]) -> host_fit.HostRow:
    """The regressors and measured host times of one `model_steps` row."""
    key = (case.name, int(row["batch"]))
    if key not in graph_cache:
        graph_cache[key] = model_step_scoring.case_graph(case, key[1])
    g = graph_cache[key]
    attention = model_step_scoring.attention_of(row.get("attention"))
    settings = TrainingSettings(batch_size=key[1], mode="train", optimizer="adamw",
                                precision=row["precision"], attention=attention)
    items = build_step(g, settings).items
    tensors = g.parameter_tensor_count

    def phase_us(name: str, phase: Phase) -> float:
        costs = host.HostModel(probe, _unit(name)).item_host_us(
            items, settings.precision, tensors, optimizer_impl=settings.optimizer_impl)
        return float(sum(c for c, item in zip(costs, items, strict=True)
                         if item.phase is phase))

    train = row["train"]
    measured = tuple(float(train["host"][p]["median_ms"]) for p in _PHASE_NAMES)
    device = [float(train[p]["median_ms"]) for p in _PHASE_NAMES]
    busy = [_busy_ms(row, p) for p in _PHASE_NAMES]
    usable = tuple(host_fit.usable_phase(h, d, b)
                   for h, d, b in zip(measured, device, busy, strict=True))
    inference = row["inference"]
    inference_host = float((inference.get("forward_host") or {}).get("median_ms", 0.0))
    return host_fit.HostRow(
        group=case.name, autocast=precisions.precision(settings.precision).autocast,
        forward_us={t: phase_us(t, Phase.FORWARD) for t in host_fit.FORWARD_TERMS},
        backward_us=phase_us("backward_kernel", Phase.BACKWARD),
        optimizer_us=phase_us("optimizer_tensor", Phase.OPTIMIZER),
        measured_host_ms=(measured[0], measured[1], measured[2]),
        usable=(usable[0], usable[1], usable[2]),
        inference_host_ms=inference_host,
        inference_usable=host_fit.usable_phase(
            inference_host, float(inference["forward"]["median_ms"]), None))


def _busy_ms(row: Mapping[str, Any], phase: str) -> float | None:
    """The instrumented step's kernel time of a phase (ms), if the row has one."""
    kernels = ((row.get("instrumented") or {}).get(phase) or {}).get("kernels")
    return float(kernels["total_us"]) / 1000.0 if kernels else None


def measured_rows(lines: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The `model_steps` rows that ran and have host times."""
    return [r for r in lines if r.get("kind") == "model_step" and r.get("status") == "ok"
            and "host" in r.get("train", {})]


def load_rows(steps: Sequence[Path], probe_path: Path
              ) -> tuple[host.HostProbe, list[host_fit.HostRow]]:
    """The probe of `probe_path` and the host rows of every eager case in `steps` files."""
    probe = probe_of(json.loads(model_step_scoring.read_capped(probe_path)))
    cases = {c.name: c for set_ in model_steps.CASE_SETS.values() for c in set_}
    cache: dict[tuple[str, int], Any] = {}
    rows = [host_row(cases[r["model"]], r, probe, cache)
            for path in steps for r in measured_rows(model_step_scoring.read_json_lines(path))
            if r.get("framework", "eager") == "eager"]
    return probe, rows


def report(rows: Sequence[host_fit.HostRow], folds: Mapping[str, host.HostCoefficients]
           ) -> list[dict[str, Any]]:
    """Per model and phase: held-out host-time MAPE over usable phases."""
    out = []
    for group in sorted(folds):
        mine = [r for r in rows if r.group == group]
        for i, phase in enumerate(_PHASE_NAMES):
            errors = [abs(host_fit.predicted_host_ms(r, folds[group])[i]
                          / r.measured_host_ms[i] - 1.0) for r in mine if r.usable[i]]
            out.append({"model": group, "phase": phase, "rows": len(errors),
                        "mape_pct": 100 * statistics.fmean(errors) if errors else None})
    return out


@dataclass(frozen=True)
class HostCheckSettings:
    """`gpuplan eval host-check`'s flags."""
    steps: tuple[Path, ...]
    """`model_steps` JSON lines files (at least one)."""
    probe: Path
    """The `bench.host_probe` JSON measured on the same host."""
    json: Path | None
    """Write the all-rows host model here."""
    folds: Path | None
    """Write each model's leave-one-out host model here (`model-step-scoring predict
    --host-folds`)."""


def run(settings: HostCheckSettings) -> int:
    """Fit, report held-out figures, optionally write the all-rows host model."""
    probe, rows = load_rows(list(settings.steps), settings.probe)
    folds = host_fit.leave_one_group_out(rows)
    for line in report(rows, folds):
        mape = f"{line['mape_pct']:.1f}" if line["mape_pct"] is not None else "-"
        print(f"{line['model']:12s} {line['phase']:9s} rows {line['rows']:2d} "
              f"held-out host MAPE {mape} %")
    if settings.folds is not None:
        settings.folds.write_text(json.dumps(
            {g: host.model_to_json(host.HostModel(probe, c)) for g, c in folds.items()},
            indent=1) + "\n", encoding="utf-8")
    final = host_fit.fit_for_bundle(rows)
    print(f"all rows: {final}")
    if settings.json is not None:
        settings.json.write_text(json.dumps(host.model_to_json(host.HostModel(probe, final)),
                                            indent=1) + "\n", encoding="utf-8")
    return 0
