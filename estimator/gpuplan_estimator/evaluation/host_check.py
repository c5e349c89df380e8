"""The host timeline against measured steps: fit leave-one-model-out, report held out.

    gpuplan eval host-check \\
        --steps docs/gpu-steps/2026-11-27-h200b/steps.jsonl \\
        --event-steps docs/gpu-steps/2026-11-27-h200/steps.jsonl \\
        --probe docs/gpu-steps/2026-11-27-h200b/host-probe.json [--json host-model.json]

For every measured case (`model_steps` rows with host times), the estimator's own work items of
that case (`model_step_scoring.case_graph`, the attention it ran) give the host regressors of
`training.host_fit`; the coefficients are fitted leave-one-model-out and each model's host
time is predicted by the fold that never saw it. A run without host clocks (`--event-steps`)
adds its host-bound phases, their event times standing for the host's (`event_host_row`).
`--json` writes the all-rows fit with its held-out spread and the probe, the object a bundle's
manifest holds (`step.host`).
"""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from gpuplan_estimator import devices
from gpuplan_estimator.core import precisions
from gpuplan_estimator.core.workload import Phase
from gpuplan_estimator.evaluation import model_step_scoring, model_steps
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates
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


def _unit(name: str | None) -> host.HostCoefficients:
    """Coefficients with only `name` at 1 (the model is linear in each); None: all at 0,
    leaving what the probe prices alone (`training_ops.ROLE`)."""
    values = {f.name: 0.0 for f in fields(host.HostCoefficients)}
    values.update({"autocast_backward": 1.0} if name is None
                  else {name: 1.0, "autocast_backward": 1.0})
    return host.HostCoefficients(**values)


@dataclass(frozen=True)
class _Regressors:
    """One case's host regressors: each phase's host cost with each coefficient at 1."""
    autocast: bool
    forward_us: dict[str, float]
    backward_us: float
    optimizer_us: float
    fixed_us: tuple[float, float]


def case_graph(case: model_steps.ModelCase, row: Mapping[str, Any],
               graph_cache: dict[tuple[str, int], Any]) -> Any:
    """The estimator's graph of a measured row's case at its batch (built once per key)."""
    key = (case.name, int(row["batch"]))
    if key not in graph_cache:
        graph_cache[key] = model_step_scoring.case_graph(case, key[1])
    return graph_cache[key]


def train_settings(row: Mapping[str, Any], mode: str = "train") -> TrainingSettings:
    """What a measured row ran, as the estimator's settings (`model_steps`: AdamW)."""
    return TrainingSettings(batch_size=int(row["batch"]), mode=mode, optimizer="adamw",
                            precision=model_step_scoring.estimator_precision(row),
                            attention=model_step_scoring.attention_of(row.get("attention")))


def _regressors(g: Any, settings: TrainingSettings, probe: host.HostProbe) -> _Regressors:
    items = build_step(g, settings).items
    tensors = g.parameter_tensor_count

    def by_phase_us(name: str | None) -> dict[Phase, float]:
        costs = host.HostModel(probe, _unit(name)).item_host_us(
            items, settings.precision, tensors, optimizer_impl=settings.optimizer_impl)
        out = dict.fromkeys(Phase, 0.0)
        for cost, item in zip(costs, items, strict=True):
            out[item.phase] += float(cost)
        return out

    fixed = by_phase_us(None)
    forward, backward = fixed[Phase.FORWARD], fixed[Phase.BACKWARD]
    return _Regressors(
        autocast=precisions.precision(settings.precision).autocast,
        forward_us={t: by_phase_us(t)[Phase.FORWARD] - forward for t in host_fit.FORWARD_TERMS},
        backward_us=by_phase_us("backward_kernel")[Phase.BACKWARD] - backward,
        optimizer_us=by_phase_us("optimizer_tensor")[Phase.OPTIMIZER],
        fixed_us=(forward, backward))


def host_row(case: model_steps.ModelCase, row: Mapping[str, Any], probe: host.HostProbe,
             graph_cache: dict[tuple[str, int], Any]) -> host_fit.HostRow:
    """The regressors and measured host times of one `model_steps` row."""
    g = case_graph(case, row, graph_cache)
    x = _regressors(g, train_settings(row), probe)
    train = row["train"]
    measured = tuple(float(train["host"][p]["median_ms"]) for p in _PHASE_NAMES)
    device = [float(train[p]["median_ms"]) for p in _PHASE_NAMES]
    # kernels only, not the profile's `total_us`: that counts the runtime's calls too (GPT-2
    # small's tf32 backward, 22.2 ms of rows for 13.6 ms of kernels, read as blocked)
    busy = [profiled_kernel_ms(row, p) for p in _PHASE_NAMES]
    usable = tuple(host_fit.usable_phase(h, d, b)
                   for h, d, b in zip(measured, device, busy, strict=True))
    inference = row["inference"]
    inference_host = float((inference.get("forward_host") or {}).get("median_ms", 0.0))
    return host_fit.HostRow(
        group=case.name, autocast=x.autocast, forward_us=x.forward_us,
        backward_us=x.backward_us, optimizer_us=x.optimizer_us, fixed_us=x.fixed_us,
        measured_host_ms=(measured[0], measured[1], measured[2]),
        usable=(usable[0], usable[1], usable[2]),
        inference_host_ms=inference_host,
        inference_usable=host_fit.usable_phase(
            inference_host, float(inference["forward"]["median_ms"]), None))


EVENT_HOST_BOUND_SHARE = 0.5
"""A phase of a run without host clocks is read as host-bound, its event time as the host's
issue time, when the kernels the estimator puts on the stream for it (`estimates.
stream_busy_ms`) fill less than this share of it (the GPU idled at least half the phase; the
event time then exceeds the issue time only by the last kernels' tail) and the phase is
`batch_flat`."""
FLAT_BATCH_RATIO = 2
FLAT_TIME_TOLERANCE = 0.15
"""A phase is batch-flat when the same model and precision at a batch at least
`FLAT_BATCH_RATIO` times larger or smaller took within this share of its time: the host's
issue time does not grow with the batch, the kernels' does. It is what the measurement says,
where the stream's estimate may be wrong (ResNet-50's fp32 convolutions on the H200 ran twice
as long as the rows predicted, and their phases passed the share test alone)."""
EVENT_PHASES = ("forward", "backward", "inference")
"""Phases of a run without host clocks that may stand for the host's time. The optimizer's
event never does: its foreach kernels are few and long, and their stream time is the estimate
least sure of itself."""


def event_ms(row: Mapping[str, Any], phase: str) -> float:
    """A `model_steps` row's event-timed median of `phase` (EVENT_PHASES)."""
    part = row["inference"]["forward"] if phase == "inference" else row["train"][phase]
    return float(part["median_ms"])


def batch_flat(rows: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, int, str], bool]:
    """Per (model, precision, batch, phase) of `rows`: whether that phase is batch-flat."""
    out: dict[tuple[str, str, int, str], bool] = {}
    for row in rows:
        batch = int(row["batch"])
        siblings = [r for r in rows if r["model"] == row["model"]
                    and r["precision"] == row["precision"]
                    and max(batch, int(r["batch"])) >= FLAT_BATCH_RATIO * min(batch,
                                                                              int(r["batch"]))]
        for phase in EVENT_PHASES:
            mine = event_ms(row, phase)
            out[(row["model"], row["precision"], batch, phase)] = any(
                abs(event_ms(r, phase) / mine - 1.0) <= FLAT_TIME_TOLERANCE for r in siblings)
    return out


def event_host_row(case: model_steps.ModelCase, row: Mapping[str, Any], probe: host.HostProbe,
                   graph_cache: dict[tuple[str, int], Any], predictor: Any,
                   device: devices.DeviceSpec, flat: Mapping[str, bool]) -> host_fit.HostRow:
    """A host row of a `model_steps` row measured without host clocks (the first H200 run):
    its host-bound phases' event times stand for the host's (`EVENT_HOST_BOUND_SHARE`);
    `flat` says which of its `EVENT_PHASES` are batch-flat (`batch_flat`)."""
    g = case_graph(case, row, graph_cache)
    settings = train_settings(row)
    x = _regressors(g, settings, probe)
    forward, backward, _ = estimates.stream_busy_ms(g, device, settings, predictor=predictor)
    (inference, _, _) = estimates.stream_busy_ms(
        g, device, train_settings(row, "inference"), predictor=predictor)
    usable = {phase: flat.get(phase, False)
              and busy < EVENT_HOST_BOUND_SHARE * event_ms(row, phase)
              for phase, busy in zip(EVENT_PHASES, (forward, backward, inference), strict=True)}
    return host_fit.HostRow(
        group=case.name, autocast=x.autocast, forward_us=x.forward_us,
        backward_us=x.backward_us, optimizer_us=x.optimizer_us, fixed_us=x.fixed_us,
        measured_host_ms=(event_ms(row, "forward"), event_ms(row, "backward"),
                          float(row["train"]["optimizer"]["median_ms"])),
        usable=(usable["forward"], usable["backward"], False),
        inference_host_ms=event_ms(row, "inference"),
        inference_usable=usable["inference"])


RUNTIME_CALL = re.compile(r"^(?:cuda|cu)[A-Z]|^Activity ")
"""Profiler rows that are host calls, not kernels: the CUDA runtime's and driver's API
(`cudaLaunchKernel`, `cuLaunchKernelEx`, `cudaDeviceSynchronize`) and the profiler's own
"Activity Buffer Request". A cuDNN kernel (`cudnn_generated_fort_native_sdpa_sm90_flash_...`,
the fused attention of BERT in bf16) is a kernel."""


def profiled_kernel_ms(row: Mapping[str, Any], phase: str) -> float | None:
    """The GPU kernels' time of one profiled phase (ms): its rows less `RUNTIME_CALL`s; None
    unless the row was instrumented and its top list holds every name (the rest's split into
    kernels and calls is unknown)."""
    kernels = ((row.get("instrumented") or {}).get(phase) or {}).get("kernels")
    if not kernels or kernels.get("rest", {}).get("count", 0):
        return None
    return sum(float(k["us"]) for k in kernels.get("top", [])
               if not RUNTIME_CALL.match(str(k["name"]))) / 1000.0


def measured_rows(lines: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The `model_steps` rows that ran and have host times."""
    return [r for r in ok_rows(lines) if "host" in r.get("train", {})]


def ok_rows(lines: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The eager `model_steps` rows that ran."""
    return [r for r in lines if r.get("kind") == "model_step" and r.get("status") == "ok"
            and r.get("framework", "eager") == "eager"]


def load_rows(steps: Sequence[Path], probe_path: Path, event_steps: Sequence[Path] = ()
              ) -> tuple[host.HostProbe, list[host_fit.HostRow]]:
    """The probe of `probe_path` and the host rows of every eager case in `steps` files
    (host clocks), and of `event_steps` files (runs without host clocks, read through the
    shipped bundle's stream: `event_host_row`)."""
    probe = probe_of(json.loads(model_step_scoring.read_capped(probe_path)))
    cases = {c.name: c for set_ in model_steps.CASE_SETS.values() for c in set_}
    cache: dict[tuple[str, int], Any] = {}
    rows = [host_row(cases[r["model"]], r, probe, cache)
            for path in steps for r in measured_rows(model_step_scoring.read_json_lines(path))]
    if event_steps:
        predictor, _ = selection.select_predictor(None, None)
        for path in event_steps:
            lines = model_step_scoring.read_json_lines(path)
            device = run_device(lines, path)
            measured = ok_rows(lines)
            flat = batch_flat(measured)
            rows += [event_host_row(cases[r["model"]], r, probe, cache, predictor, device,
                                    {phase: flat[(r["model"], r["precision"], int(r["batch"]),
                                                  phase)] for phase in EVENT_PHASES})
                     for r in measured]
    return probe, rows


def run_device(lines: Sequence[Mapping[str, Any]], path: Path) -> devices.DeviceSpec:
    """The catalog device a `model_steps` file's provenance names (NVML's name)."""
    for line in lines:
        if line.get("kind") == "provenance":
            name = (line.get("nvml") or {}).get("name")
            if name:
                return devices.resolve_device(str(name))
    raise ValueError(f"{path}: no provenance row naming the GPU (nvml.name)")


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
    event_steps: tuple[Path, ...] = ()
    """`model_steps` files of runs without host clocks (`event_host_row`)."""


def run(settings: HostCheckSettings) -> int:
    """Fit, report held-out figures, optionally write the all-rows host model."""
    probe, rows = load_rows(list(settings.steps), settings.probe, settings.event_steps)
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
