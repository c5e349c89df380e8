"""The JSON documents of plans and estimates: one shape for the HTTP API (`POST /v1/plans`,
`/v1/estimate`) and `gpuplan plan|estimate -o json` (which add their request beside it).

The planner answers with plain dataclasses (`planning.planner.PlannedRequest`,
`EstimatedRequest`); this module is the one place that turns them into the wire's dicts, whose
fields `interfaces.http.responses` declares and `docs/estimate-json.md` documents.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.graph import export_checks
from gpuplan_estimator.planning import calibrating, estimates, placement, planner, requests
from gpuplan_estimator.step.attention import attention_report
from gpuplan_estimator.step.decomposition import TrainingSettings

SCHEMA_VERSION = 1
"""Version of the plan and estimate documents (and of the CLI's `-o json|yaml` envelope)."""
PLAN_CANDIDATES = 20
"""Ranked candidates a plan document lists by default (the HTTP API's answer)."""


def plan_request_json(req: requests.PlanRequest, ctx: planner.PlannerContext, *,
                      max_candidates: int | None = PLAN_CANDIDATES) -> dict[str, Any]:
    """The plan document of a request (`planner.plan_request`, then `planned_json`)."""
    return planned_json(planner.plan_request(req, ctx), max_candidates=max_candidates)


def estimate_request_json(req: requests.EstimateRequest,
                          ctx: planner.PlannerContext) -> dict[str, Any]:
    """The estimate document of a request (`planner.estimate_request`, then `estimated_json`)."""
    return estimated_json(planner.estimate_request(req, ctx))


def planned_json(answer: planner.PlannedRequest, *,
                 max_candidates: int | None = PLAN_CANDIDATES) -> dict[str, Any]:
    """The plan document with its notes: `plan_json` plus the candidates' total, the scaling
    model's source, the inventory entries left out and the attention report.

    `max_candidates` bounds the ranked candidates listed (None: every one).
    """
    out = plan_json(answer.plan, max_candidates=max_candidates)
    out["candidates_total"] = len(answer.plan.candidates)
    out["scaling"] = answer.scaling.as_dict()
    out["notes"] = [f"{t}: {why}" for t, why in answer.skipped] + list(answer.price_notes)
    out["attention"] = answer.attention.as_dict()
    out["warnings"] = list(answer.warnings)
    return out


def estimated_json(answer: planner.EstimatedRequest) -> dict[str, Any]:
    """The estimate document of a request's answer, calibrated by the context's calibration."""
    return estimate_json(answer.graph, answer.results, answer.settings,
                         predictor_source=answer.predictor_source, epochs=answer.epochs,
                         dataset_size=answer.dataset_size, calibration=answer.calibration)


def candidate_json(c: placement.PlacementCandidate) -> dict[str, Any]:
    """One candidate as the plan JSON shows it (rounded for reading, calibration exact)."""
    return {
        "gpu_type": c.gpu_type,
        "device": c.device_key,
        "gpu_count": c.gpu_count,
        "gpus_per_node": c.gpus_per_node,
        "nodes": c.nodes,
        "per_gpu_batch": c.per_gpu_batch,
        "step_time_ms": round(c.step_time_ms, 4),
        "allreduce_ms": round(c.allreduce_ms, 4),
        "estimated_seconds": round(c.estimated_seconds, 3),
        "interval_seconds": [round(c.interval_seconds[0], 3), round(c.interval_seconds[1], 3)],
        "memory_bytes_per_gpu": c.memory_bytes_per_gpu,
        "cost_usd": round(c.cost_usd, 4) if c.cost_usd is not None else None,
        "price_known": c.cost_usd is not None,
        "predictor": c.predictor,
        "data_basis": c.data_basis,
        # Unrounded: the operator reports it back with the job's outcome, and the estimator
        # divides the (calibrated) estimated_seconds by it to store the model's own estimate.
        "calibration": c.calibration.as_dict(),
        # What a scaling fit needs back with the job's outcome (`scaling.samples_from_outcomes`):
        # the single-GPU step at the per-GPU batch, as planned, and what was communicated.
        "steps": c.steps,
        "forward_ms": round(c.forward_ms, 4),
        "backward_ms": round(c.backward_ms, 4),
        "optimizer_ms": round(c.optimizer_ms, 4),
        "gradient_bytes": c.gradient_bytes,
        "intra_node_gbps": c.intra_node_gbps,
        **_setup_json(c),
    }


def _setup_json(c: placement.PlacementCandidate) -> dict[str, Any]:
    """How the candidate runs: layout, memory strategy, memory by part, step time by part."""
    if c.layout is None or c.strategy is None or c.memory is None:
        return {}
    return {
        "parallelism": {"dp": c.layout.dp, "tp": c.layout.tp, "pp": c.layout.pp,
                        "micro_batches": c.layout.micro_batches, "micro_batch": c.micro_batch,
                        "ep": c.layout.ep},
        "strategy": {"label": c.strategy.label, "zero_stage": c.strategy.zero_stage,
                     "fsdp": c.strategy.fsdp, "checkpointing": c.strategy.checkpointing,
                     "checkpoint_fraction": c.strategy.checkpoint_fraction,
                     "gradient_accumulation": c.strategy.gradient_accumulation,
                     "offload_optimizer": c.strategy.offload_optimizer},
        "memory": c.memory.as_dict(),
        "step_ms": {name: round(ms, 4) for name, ms in c.parts_ms.items()},
    }


def plan_json(result: placement.Plan, *, max_candidates: int | None = 20) -> dict[str, Any]:
    """The plan JSON: the chosen candidate, the best others, and every rejection's reason."""
    return {
        "schema_version": SCHEMA_VERSION,
        "plan": candidate_json(result.chosen) if result.chosen else None,
        "candidates": [candidate_json(c) for c in result.candidates[:max_candidates]],
        "rejected": [
            {"gpu_type": r.gpu_type, "gpu_count": r.gpu_count, "reason": r.reason}
            for r in result.rejected
        ],
        "reasons_by_type": dict(result.reasons_by_type),
    }


def estimate_json(
    graph: ModelGraph, results: Sequence[estimates.DeviceStepEstimate],
    settings: TrainingSettings, *,
    predictor_source: str, epochs: int | None = None, dataset_size: int | None = None,
    include_layers: bool = False, calibration: calibrating.CalibrationTable | None = None,
) -> dict[str, Any]:
    """The stable estimate document of `docs/estimate-json.md`.

    Each device gets `calibrated_*` fields next to the model's own (which are never changed),
    from `calibration` fitted to job outcomes; without one they equal the model's.
    """
    cal = calibration if calibration is not None else calibrating.CalibrationTable()
    mode = calibrating.mode_of(settings.mode)
    return {
        "schema_version": SCHEMA_VERSION,
        "model": {
            "name": graph.name, "layers": len(graph.layers), "parameters": graph.parameter_count,
            "opset": graph.opset, "dim_bindings": dict(graph.dim_bindings),
            "flops_per_step": estimates.model_flops_per_step(graph, settings),
        },
        "settings": {
            "mode": settings.mode,
            # Inference updates no weights: no optimizer to name.
            "optimizer": settings.optimizer if settings.mode == "train" else None,
            "optimizer_impl": settings.optimizer_impl if settings.mode == "train" else None,
            "precision": settings.precision, "attention": settings.attention,
            "batch_size": settings.batch_size,
            "epochs": epochs, "dataset_size": dataset_size,
        },
        # Whether fused attention found anything to fuse: otherwise it is the eager price.
        "attention": attention_report(graph, settings.attention).as_dict(),
        # What the export left out that training runs (BatchNorm folded into Conv).
        "warnings": export_checks.training_warnings(settings.mode, graph.folded_batchnorm),
        "predictor_source": predictor_source,
        "devices": [_device_json(r, include_layers, cal, mode) for r in results],
    }


to_json = estimate_json
"""The package's public name of `estimate_json` (`gpuplan_estimator.to_json`), kept for the
library's callers."""


def _device_json(r: estimates.DeviceStepEstimate, include_layers: bool,
                 cal: calibrating.CalibrationTable,
                 mode: str) -> dict[str, Any]:
    c = calibrating.calibrate(cal, r.device, mode, r.step_time_ms, *r.interval_ms)
    factor = c.correction.factor
    out: dict[str, Any] = {
        "device": r.device,
        "data_basis": r.data_basis,
        "forward_ms": r.forward_ms,
        "backward_ms": r.backward_ms,
        "optimizer_ms": r.optimizer_ms,
        "step_time_ms": r.step_time_ms,
        "interval_ms": {"p10": r.interval_ms[0], "p90": r.interval_ms[1]},
        "steps_per_epoch": r.steps_per_epoch,
        "epoch_seconds": r.epoch_seconds,
        "total_seconds": r.total_seconds,
        "calibration": c.correction.as_dict(),
        "calibrated_step_time_ms": c.median_ms,
        "calibrated_interval_ms": {"p10": c.p10_ms, "p90": c.p90_ms},
        "calibrated_epoch_seconds": (r.epoch_seconds * factor
                                     if r.epoch_seconds is not None else None),
        "calibrated_total_seconds": (r.total_seconds * factor
                                     if r.total_seconds is not None else None),
        "throughput": {"samples_per_s": r.samples_per_s, "tokens_per_s": r.tokens_per_s},
        "mfu": r.mfu,
        "cost_usd": {"price_per_hour": r.price_per_hour_usd,
                     "per_step": r.cost_usd(r.step_time_ms / 1000.0),
                     "per_epoch": r.cost_usd(r.epoch_seconds),
                     "total": r.cost_usd(r.total_seconds)},
        "memory_bytes": r.memory.total_bytes,
        "memory": r.memory.as_dict(),
        "memory_available_bytes": r.memory_available_bytes,
        "fits": r.fits,
        "predictor": {name: round(share, 6) for name, share in r.predictor.items()},
        "uncovered_ops": list(r.uncovered_ops),
        "shape_only_layers": r.shape_only_layers,
        "host": {"gpu_busy_ms": r.gpu_busy_ms, "host_ms": r.host_ms, "bound": estimates.bound_of(r),
                 "compiled_saving_ms": estimates.compiled_saving_ms(r), "probe": r.host_source},
        "top_layers": [_layer_json(layer) for layer in r.top_layers(5)],
    }
    if include_layers:
        out["layers"] = [_layer_json(layer) for layer in r.layers]
    return out


def _layer_json(layer: estimates.LayerTimeEstimate) -> dict[str, Any]:
    return {
        "name": layer.name, "op_type": layer.op_type, "family": layer.family,
        "forward_ms": layer.forward_ms, "backward_ms": layer.backward_ms,
        "p10_ms": layer.p10_ms, "p90_ms": layer.p90_ms, "predictor": layer.predictor,
    }
