"""The estimator against whole-model steps measured by `model_steps` (issue #18 part 4).

Two halves, so that the prediction is on record before the measurement exists:

    gpuplan eval model-step-scoring predict \\
        --device h100-sxm-80gb --device h200-sxm-141gb --out predicted.json
    gpuplan eval model-step-scoring score \\
        --predicted predicted.json --measured steps.jsonl [--markdown table.md]

`predict` prices every case of `model_steps.FULL_CASES` (`--cases smoke`: the tiny ones a CPU
rehearsal of `hack/gpu_campaign.sh` runs) with the active bundle (GPT-2, BERT
and OPT written by `zoo`; the torchvision models exported on the meta device) and records the
bundle, commit, date and command, once with each attention (`options.ATTENTIONS`). `score`
joins the two on (model, batch, precision), the device the measurement names (NVML's name
resolved in the catalog) and the attention it ran (`attention_of`), and reports the error of
the inference forward, the training step's forward + backward (what the NeuSight labels
compare) and the whole step with AdamW, their interval coverage, and the memory estimate
against the measured peak.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core import errors, options, provenance
from gpuplan_estimator.cost.aligned_gemm import AlignedGemmFit
from gpuplan_estimator.evaluation import model_steps
from gpuplan_estimator.evaluation.model_steps import ModelCase
from gpuplan_estimator.graph import batching, exporting
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import estimates, intervals
from gpuplan_estimator.step import host
from gpuplan_estimator.step.decomposition import TrainingSettings
from gpuplan_estimator.step.host import HostModel
from gpuplan_estimator.training.step_spread import StepResidual

OPTIMIZER = "adamw"  # what `model_steps` steps with
MAX_INPUT_BYTES = 64 * 1024 * 1024
PHASES = ("inference_forward", "forward_backward", "train_step")
MEMORY_MODES = ("train", "inference")
"""Measured peaks (`model_steps`' `peak_memory_bytes`) scored against `{mode}_memory_bytes`."""
IEEE_FP32 = "fp32-ieee"
PREDICTED_PRECISIONS = (*model_steps.PRECISIONS, IEEE_FP32)
"""What `predict` prices by default: the campaign's precisions, and fp32 with cuDNN's TF32 off
(what the first H200 run's fp32 rows ran, `estimator_precision`)."""
FUSED_IMPLEMENTATIONS = frozenset({"sdpa", "flash_attention_2", "flash_attention_3",
                                   "flex_attention"})
"""Attention implementations that run the core as one fused kernel."""


def case_graph(case: ModelCase, batch: int) -> graph.ModelGraph:
    """The estimator's graph of one case at `batch` (structure only, no weights)."""
    if case.source == "torchvision":
        def factory() -> tuple[Any, tuple[Any, ...]]:  # what `model_steps` runs, on meta
            inputs, _ = model_steps.make_batch(case, batch, "cpu")
            return model_steps.build_model(case), tuple(inputs.values())

        source = exporting.from_torch_factory(factory, label=case.name)
        return batching.load_at_batch(source, batch, {}, name=case.name)
    config = dict(model_steps.hf_config(case).to_dict())
    source = exporting.hf_config_graph(config, batch=batch, sequence=case.sequence,
                                       label=case.name, name=case.name)
    dims = {batching.SEQUENCE_DIM: case.sequence} if case.sequence is not None else {}
    return batching.load_at_batch(source, batch, dims, name=case.name)


def attention_of(implementation: str | None) -> str:
    """The estimator's attention (`options.ATTENTIONS`) for the implementation a measured row
    ran: transformers' `_attn_implementation`, or what `model_steps` records for torchvision."""
    return options.FUSED_ATTENTION if implementation in FUSED_IMPLEMENTATIONS \
        else options.EAGER_ATTENTION


@dataclass(frozen=True)
class StepSpread:
    """How predicted intervals hold the step-level spread (`intervals.STEP_SIGMA_KEY`)."""

    folds: Mapping[str, intervals.StepSigma] | None = None
    """Case -> the spread fitted without it (`training.step_spread.leave_one_group_out`); a
    case it lacks gets the bundle's."""
    off: bool = False
    """No step-level spread: the kernels' and host's intervals alone, what it is fitted on."""

    def for_case(self, case: str) -> intervals.StepSigma | None:
        """The spread to price `case` with (None: the bundle's)."""
        if self.off:
            return intervals.no_step_sigma()
        return (self.folds or {}).get(case)

    def describe(self) -> str:
        """What a prediction file records: "none", "folds" or "bundle"."""
        return "none" if self.off else "folds" if self.folds is not None else "bundle"


def _estimate(g: graph.ModelGraph, batch: int, mode: str, precision: str, attention: str,
              specs: Sequence[devices.DeviceSpec], predictor: Any,
              host_model: HostModel | None = None,
              step_log_sigma: intervals.StepSigma | None = None
              ) -> list[estimates.DeviceStepEstimate]:
    settings = TrainingSettings(batch_size=batch, mode=mode, optimizer=OPTIMIZER,
                                precision=precision, attention=attention)
    return list(estimates.estimate(g, specs, settings, predictor=predictor,
                                   host_model=host_model, step_log_sigma=step_log_sigma))


def predict(cases: Sequence[ModelCase], specs: Sequence[devices.DeviceSpec],
            precisions: Sequence[str], bundle: str | None,
            progress: Callable[[str], None] = lambda _: None,
            host_folds: Mapping[str, HostModel] | None = None,
            aligned_folds: Mapping[str, AlignedGemmFit] | None = None,
            step_spread: StepSpread | None = None) -> dict[str, Any]:
    """Predicted rows of every (case, batch, precision, device), and what predicted them.

    `host_folds` maps a case to the host model fitted without it (leave-one-model-out),
    `aligned_folds` to the aligned-GEMM utilisation fitted without it; a case either lacks is
    priced with the bundle's. `step_spread` says how the intervals hold the step-level
    spread (`intervals.STEP_SIGMA_KEY`): the bundle's (None), its folds, or none."""
    spread = step_spread or StepSpread()
    bundle_predictor, source = selection.select_predictor(bundle, None)
    rows = []
    for case in cases:
        host_model = (host_folds or {}).get(case.name)
        sigma = spread.for_case(case.name)
        predictor = bundle_predictor
        if case.name in (aligned_folds or {}) and hasattr(predictor, "with_aligned_gemm"):
            predictor = predictor.with_aligned_gemm((aligned_folds or {})[case.name])
        for batch in case.batches:
            g = case_graph(case, batch)
            for precision, attention in itertools.product(precisions, options.ATTENTIONS):
                progress(f"{case.name} batch {batch} {precision} {attention} attention")
                usable = [d for d in specs if devices.supports_precision(d, precision)]
                inference = _estimate(g, batch, "inference", precision, attention, usable,
                                      predictor, host_model, sigma)
                train = _estimate(g, batch, "train", precision, attention, usable, predictor,
                                  host_model, sigma)
                for inf, tr in zip(inference, train, strict=True):
                    rows.append({
                        "model": case.name, "batch": batch, "precision": precision,
                        "attention": attention, "device": tr.device,
                        "data_basis": tr.data_basis,
                        "inference_forward_ms": inf.forward_ms,
                        "inference_forward_interval_ms": list(inf.interval_ms),
                        "forward_backward_ms": tr.forward_ms + tr.backward_ms,
                        "forward_backward_interval_ms": list(tr.forward_backward_interval_ms),
                        "train_step_ms": tr.step_time_ms,
                        "train_step_interval_ms": list(tr.interval_ms),
                        "optimizer_ms": tr.optimizer_ms,
                        "train_gpu_busy_ms": tr.gpu_busy_ms,
                        "train_host_ms": tr.host_ms,
                        "train_host_bound": tr.host_bound,
                        "inference_host_bound": inf.host_bound,
                        # max_memory_allocated's counterpart: no context, no reserve
                        "train_memory_bytes": tr.memory.allocated_peak_bytes,
                        "inference_memory_bytes": inf.memory.allocated_peak_bytes})
    return {"predictor": source, "bundle_version": selection.bundle_version_of(source),
            "step_spread": spread.describe(), "rows": rows}


def measured_phases(row: Mapping[str, Any]) -> dict[str, float]:
    """A `model_steps` row's medians under the names `predict` writes."""
    train = row["train"]
    return {"inference_forward": float(row["inference"]["forward"]["median_ms"]),
            "forward_backward": float(train["forward"]["median_ms"])
            + float(train["backward"]["median_ms"]),
            "train_step": float(train["step"]["median_ms"])}


def score(predicted: Mapping[str, Any], measured: Iterable[Mapping[str, Any]],
          resolve: Callable[[str], str]) -> list[dict[str, Any]]:
    """One row per measured configuration that has a prediction: predicted, measured, signed
    error (predicted / measured - 1) and whether the measurement is inside the interval."""
    lines = list(measured)
    head = next((r for r in lines if r.get("kind") == "provenance"), None)
    if head is None:
        raise ValueError("the measured file has no provenance row (is it model_steps output?)")
    name = (head.get("nvml") or {}).get("name") or head.get("device_name") or head["device"]
    device = resolve(str(name))
    # Predictions written before attention was a setting priced it eager.
    by_key = {(p["model"], p["batch"], p["precision"], p["device"],
               p.get("attention", options.EAGER_ATTENTION)): p for p in predicted["rows"]}
    out = []
    for r in lines:
        if r.get("kind") != "model_step" or r.get("status") != "ok":
            continue
        attention = attention_of(r.get("attention"))
        precision = estimator_precision(r)
        p = by_key.get((r["model"], r["batch"], precision, device, attention))
        if p is None:
            continue
        row: dict[str, Any] = {"model": r["model"], "batch": r["batch"],
                               "precision": precision, "device": device,
                               "attention": attention, "data_basis": p["data_basis"]}
        for phase, ms in measured_phases(r).items():
            low, high = p[f"{phase}_interval_ms"]
            row[phase] = {"predicted_ms": p[f"{phase}_ms"], "measured_ms": ms,
                          "interval_ms": [low, high],
                          "error": p[f"{phase}_ms"] / ms - 1.0, "inside": low <= ms <= high}
        for mode in MEMORY_MODES:
            peak = r[mode].get("peak_memory_bytes")
            predicted_bytes = p.get(f"{mode}_memory_bytes")  # older files: train only
            if peak and predicted_bytes is not None:
                row[f"{mode}_memory"] = {"predicted_bytes": predicted_bytes,
                                         "measured_bytes": peak,
                                         "error": predicted_bytes / peak - 1.0}
        out.append(row)
    return out


STEP_KIND_OF_PHASE = {"train_step": "train", "inference_forward": "inference"}
"""The scored phases that are whole steps, and their `intervals.STEP_KINDS`."""


def step_residuals(scored: Iterable[Mapping[str, Any]]) -> list[StepResidual]:
    """Each scored whole step (`STEP_KIND_OF_PHASE`) against its prediction and interval,
    grouped by model (`training.step_spread`)."""
    return [StepResidual(group=str(row["model"]), kind=kind,
                         math=intervals.step_math(str(row["precision"])),
                         measured_ms=float(row[phase]["measured_ms"]),
                         predicted_ms=float(row[phase]["predicted_ms"]),
                         interval_ms=(float(row[phase]["interval_ms"][0]),
                                      float(row[phase]["interval_ms"][1])))
            for row in scored for phase, kind in STEP_KIND_OF_PHASE.items() if phase in row]


def estimator_precision(row: Mapping[str, Any]) -> str:
    """The estimator's precision of what a measured row ran: its own, but "fp32-ieee" for an
    fp32 row whose cuDNN convolutions had TF32 off. A row without its switches (`tf32`) was
    measured before `model_steps` kept PyTorch's defaults, when fp32 turned TF32 off for both."""
    switches = row.get("tf32") or {"matmul": False, "cudnn": False}
    if row["precision"] == "fp32" and not switches.get("cudnn", False):
        return IEEE_FP32
    return str(row["precision"])


def summary(scored: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """MAPE, P90 APE and interval coverage per precision and phase, and over all."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for row in scored:
        for phase in (*PHASES, *(f"{m}_memory" for m in MEMORY_MODES)):
            if phase in row:
                for precision in (row["precision"], "all"):
                    groups.setdefault((precision, phase), []).append(row[phase])
    out = []
    for (precision, phase), cells in sorted(groups.items()):
        ape = sorted(abs(c["error"]) * 100.0 for c in cells)
        inside = [c["inside"] for c in cells if "inside" in c]
        out.append({"precision": precision, "phase": phase, "rows": len(cells),
                    "mape_pct": statistics.fmean(ape),
                    "p90_ape_pct": ape[min(len(ape) - 1, int(0.9 * len(ape)))],
                    "inside_pct": 100.0 * sum(inside) / len(inside) if inside else None})
    return out


def markdown(scored: Sequence[Mapping[str, Any]]) -> str:
    """The summary and every row as Markdown tables."""
    lines = ["| precision | phase | rows | MAPE % | P90 APE % | in P10–P90 % |",
             "|---|---|--:|--:|--:|--:|"]
    for s in summary(scored):
        inside = f"{s['inside_pct']:.0f}" if s["inside_pct"] is not None else "–"
        lines.append(f"| {s['precision']} | {s['phase']} | {s['rows']} | {s['mape_pct']:.1f} "
                     f"| {s['p90_ape_pct']:.1f} | {inside} |")
    lines += ["", "| model | batch | precision | attention | device | basis | phase | "
              "predicted ms | measured ms | error % |",
              "|---|--:|---|---|---|---|---|--:|--:|--:|"]
    for r in scored:
        for phase in PHASES:
            c = r[phase]
            lines.append(f"| {r['model']} | {r['batch']} | {r['precision']} | "
                         f"{r.get('attention', options.EAGER_ATTENTION)} | {r['device']} "
                         f"| {r['data_basis']} | {phase} | {c['predicted_ms']:.2f} | "
                         f"{c['measured_ms']:.2f} | {100 * c['error']:+.1f} |")
    return "\n".join(lines) + "\n"


def read_capped(path: Path) -> str:
    """A measurement or prediction file's text; SystemExit naming it when over the cap."""
    if path.stat().st_size > MAX_INPUT_BYTES:
        raise SystemExit(f"{path}: larger than {MAX_INPUT_BYTES} bytes")
    return path.read_text(encoding="utf-8")


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file such as `model_steps` writes (size-capped)."""
    return [json.loads(line) for line in read_capped(path).splitlines() if line.strip()]


@dataclass(frozen=True)
class PredictSettings:
    """`gpuplan eval model-step-scoring predict`'s flags."""
    devices: tuple[str, ...]
    """Catalog devices to price on (at least one)."""
    precisions: tuple[str, ...]
    cases: str
    """The campaign's case set (`model_steps.CASE_SETS`)."""
    models: tuple[str, ...]
    """Case names to keep (empty: every case of the set)."""
    bundle: str | None
    """Model bundle directory (None: the active one)."""
    out: Path
    host_folds: Path | None
    """JSON of case -> host model fitted without it (`host-check --folds`)."""
    aligned_folds: Path | None = None
    """JSON of case -> aligned-GEMM utilisation fitted without it (`stream-check --folds`)."""
    step_folds: Path | None = None
    """JSON of case -> step-level spread fitted without it (`hack/bundle_step_spread.py`)."""
    no_step_spread: bool = False
    """Intervals without the step-level spread (what `hack/bundle_step_spread.py` fits on)."""


@dataclass(frozen=True)
class ScoreSettings:
    """`gpuplan eval model-step-scoring score`'s flags."""
    predicted: Path
    measured: Path
    markdown: Path | None
    """Also write the tables here."""


def run_predict(settings: PredictSettings, command: str) -> int:
    """Price the campaign's cases and write them with their provenance (`command`: the command
    line that ran this, as recorded)."""
    catalog = devices.load_catalog()
    specs = [devices.resolve_device(d, catalog) for d in settings.devices]
    try:
        cases = model_steps.select_cases(model_steps.CASE_SETS[settings.cases],
                                         list(settings.models))
    except ValueError as exc:
        raise errors.InvalidRequestError("--models", str(exc)) from None
    folds = None
    if settings.host_folds is not None:
        folds = {name: host.model_from_json(doc)
                 for name, doc in json.loads(read_capped(settings.host_folds)).items()}
    aligned = None
    if settings.aligned_folds is not None:
        aligned = {name: AlignedGemmFit.from_json(doc, f"{settings.aligned_folds}: {name}")
                   for name, doc in json.loads(read_capped(settings.aligned_folds)).items()}
    doc = predict(cases, specs, list(settings.precisions), settings.bundle,
                  progress=lambda m: print(m, file=sys.stderr, flush=True), host_folds=folds,
                  aligned_folds=aligned, step_spread=_step_spread(settings))
    doc["provenance"] = {"date": datetime.now(UTC).isoformat(timespec="seconds"),
                         "commit": provenance.git_commit(), "command": command}
    settings.out.parent.mkdir(parents=True, exist_ok=True)
    settings.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(doc['rows'])} predictions to {settings.out}")
    return 0


def _step_spread(settings: PredictSettings) -> StepSpread:
    if settings.step_folds is None:
        return StepSpread(off=settings.no_step_spread)
    if settings.no_step_spread:
        raise errors.InvalidRequestError("--step-folds", "conflicts with --no-step-spread")
    doc = json.loads(read_capped(settings.step_folds))
    if not isinstance(doc, dict):
        raise errors.InvalidRequestError(str(settings.step_folds), "must map cases to spreads")
    return StepSpread(folds={name: intervals.step_sigma(entry, f"{settings.step_folds}: {name}")
                             for name, entry in doc.items()})


def run_score(settings: ScoreSettings) -> int:
    """Join predictions with a measurement and print (and maybe write) the tables; 1 when no
    measured row has a prediction."""
    predicted = json.loads(read_capped(settings.predicted))
    measured = read_json_lines(settings.measured)
    scored = score(predicted, measured, lambda n: devices.resolve_device(n).key)
    if not scored:
        print("no measured row has a prediction (device, model, batch or precision differ)",
              file=sys.stderr)
        return 1
    text = markdown(scored)
    if settings.markdown is not None:
        settings.markdown.write_text(text, encoding="utf-8")
    print(text)
    return 0
