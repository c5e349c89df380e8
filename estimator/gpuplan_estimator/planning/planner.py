"""Glue behind the service and `gpuplan plan`: request → graph → estimates → plan (no I/O here
beyond parsing the model bytes it is handed)."""

from __future__ import annotations

import base64
import dataclasses
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core.errors import GpuplanError, InvalidRequestError, UnknownDeviceError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.graph import batching, export_checks, exporting
from gpuplan_estimator.latency import selection
from gpuplan_estimator.planning import (
    calibrating,
    estimates,
    model_facts,
    parallel_inputs,
    parallelism,
    placement,
    requests,
    workloads,
)
from gpuplan_estimator.planning import scaling as scaling_fits
from gpuplan_estimator.planning.scaling import ScalingModel
from gpuplan_estimator.step import host, memory
from gpuplan_estimator.step.attention import attention_report
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step

log = logging.getLogger(__name__)


class NoFeasiblePlanError(GpuplanError):
    """No GPU type x count satisfies memory, cluster size and the objective."""

    def __init__(self, message: str, rejections: Sequence[tuple[str, str]]) -> None:
        self.rejections = tuple(rejections)
        """(GPU type, why it has no plan) for each type left out."""
        self.details = tuple(f"{t}: {why}" for t, why in self.rejections)
        super().__init__(f"{message}: {'; '.join(self.details)}" if self.details else message)


@dataclass(frozen=True)
class PlannerContext:
    """What every plan and estimate request needs: catalog, predictor, scaling, calibration."""
    catalog: devices.Catalog
    predictor: LatencyPredictor
    predictor_source: str  # e.g. "bundle:/path (shipped)" or "roofline"
    scaling: ScalingModel = field(default_factory=ScalingModel)
    scaling_fit: scaling_fits.FittedScaling = scaling_fits.ANALYTIC
    """Where `scaling` comes from (fitted to outcomes or analytic), reported on every plan."""
    manifest: Mapping[str, Any] = field(default_factory=dict)
    calibration: calibrating.Calibration = field(default_factory=calibrating.Calibration)
    """Fitted from job outcomes by the service; identity (factor 1) when there are none."""
    host_probes: Mapping[str, host.HostProbe] = field(default_factory=dict)
    """Per device key, the newest host probe measured on its nodes (the performance
    database's, `perfdb.probe_context`); a device without one gets the bundle's default."""

    def describe(self) -> dict[str, Any]:
        """Predictor name and source, bundle manifest and catalog keys, as JSON-ready data."""
        return {
            "predictor": self.predictor.name,
            "source": self.predictor_source,
            "manifest": dict(self.manifest),
            "devices": list(self.catalog.keys()),
        }


def training_settings(t: requests.TrainingRequest, batch: int) -> TrainingSettings:
    """The request's mode, optimizer, precision and attention at batch size `batch`."""
    return TrainingSettings(mode=t.mode, optimizer=t.optimizer, precision=t.precision,
                            attention=t.attention, batch_size=batch)


def graph_at(model: bytes, t: requests.TrainingRequest, batch: int) -> ModelGraph:
    """The request's model at `batch`, the one rule of plans and estimates alike: a model
    exported with a fixed batch is re-batched (`graph.load_at_batch`); one whose constants keep
    its batch is refused on ``training.batch_size`` (issue #20: plans used to estimate it at
    its own batch and scale per sample, a different batch than the one asked for)."""
    try:
        return graph.load_at_batch(model, batch, dict(t.dims))
    except InvalidRequestError as exc:
        if exc.field == "batch":
            raise InvalidRequestError("training.batch_size", exc.message) from exc
        prefix = "dim_bindings."
        if exc.field.startswith(prefix):
            raise InvalidRequestError("training.dims." + exc.field[len(prefix):],
                                      exc.message) from exc
        raise


def _estimates_at(model: bytes, t: requests.TrainingRequest, batch: int,
                  specs: Sequence[devices.DeviceSpec], ctx: PlannerContext
                  ) -> tuple[int, Sequence[estimates.DeviceEstimate]]:
    """Estimates at `batch` (`graph_at`)."""
    g = graph_at(model, t, batch)
    return batch, estimates.estimate(g, specs, training_settings(t, batch),
                                     predictor=ctx.predictor, host_probes=ctx.host_probes)


def _point(e: estimates.DeviceEstimate, batch: int, calibrated: calibrating.Calibrated
           ) -> placement.StepPoint:
    """One step as the planner sees it: every phase scaled by the job outcomes' factor (they
    measured the whole step, so there is no per-phase factor to apply), the interval theirs."""
    factor = calibrated.correction.factor
    return placement.StepPoint(
        per_gpu_batch=batch, forward_ms=e.forward_ms * factor,
        backward_ms=e.backward_ms * factor, optimizer_ms=e.optimizer_ms * factor,
        memory_bytes=e.memory.total_bytes, p10_ms=calibrated.p10_ms, p90_ms=calibrated.p90_ms,
        activation_bytes=e.memory.activations_bytes,
    )


def _calibrated(e: estimates.DeviceEstimate, cal: calibrating.Calibration, mode: str
                ) -> calibrating.Calibrated:
    p10, p90 = e.interval_ms
    return calibrating.calibrate(cal, e.device, mode, e.step_time_ms, p10, p90)


def step_profiles(req: requests.PlanRequest, specs: Sequence[devices.DeviceSpec],
                  ctx: PlannerContext) -> dict[str, placement.StepProfile]:
    """Estimate at the global batch, the smallest per-GPU batch and batch 1; interpolate between.

    A model exported with a fixed batch is re-batched to each, or refused (`graph_at`).
    Step times are calibrated per device by `ctx.calibration`; the profile carries the
    correction so the planner scales its all-reduce by the same factor (see `placement`).
    Each profile also carries its device and the step cut into the regions tensor and pipeline
    parallelism see (from the smaller batch's estimate; None for a model without blocks).
    """
    t = req.training
    mode = calibrating.mode_of(t.mode)
    # Micro-batches (accumulation, pipelines) reach below the smallest per-GPU batch: a point
    # at batch 1 anchors them.
    wanted = sorted({t.batch_size, math.ceil(t.batch_size / req.objective.max_gpus), 1})
    by_batch = dict(_estimates_at(req.model_onnx, t, b, specs, ctx) for b in wanted)
    batches = sorted(by_batch)
    profiles = {}
    for i, spec in enumerate(specs):
        first = by_batch[batches[0]][i]
        calibrated = [_calibrated(by_batch[b][i], ctx.calibration, mode) for b in batches]
        profiles[spec.key] = placement.StepProfile(
            device_key=spec.key,
            memory_capacity_bytes=memory.usable_memory_bytes(spec),
            gradient_bytes=first.memory.reduced_gradients_bytes,
            price_per_gpu_hour_usd=spec.price_per_hour_usd if spec.has_price else None,
            interconnect_gbps=spec.interconnect_gbps,
            points=tuple(_point(by_batch[b][i], b, c)
                         for b, c in zip(batches, calibrated, strict=True)),
            predictor=ctx.predictor_source,
            data_basis=first.data_basis,
            calibration=calibrated[0].correction,  # per device and mode: equal at every batch
            device=spec,
            # The regions' shares at a per-GPU batch (batch 1 is the anchor, not typical).
            split=_split(by_batch[batches[min(1, len(batches) - 1)]][i],
                         calibrated[0].correction.factor),
        )
    return profiles


def _split(e: estimates.DeviceEstimate, factor: float) -> parallelism.SingleGpuSplit | None:
    """The estimate's step by region, calibrated like the points; None without blocks."""
    try:
        split = parallel_inputs.split_from_estimate(e)
    except InvalidRequestError:
        return None
    return parallelism.with_step(split, batch=split.batch, forward_ms=split.forward_ms * factor,
                                 backward_ms=split.backward_ms * factor,
                                 optimizer_ms=split.optimizer_ms * factor)


def _pools(
    req: requests.PlanRequest, ctx: PlannerContext
) -> tuple[list[placement.GpuPool], list[tuple[str, str]]]:
    """The usable pools, and (GPU type, why) for each inventory entry left out."""
    allowed = {ctx.catalog.resolve(n).key for n in req.gpu_types} if req.gpu_types else None
    pools: list[placement.GpuPool] = []
    skipped: list[tuple[str, str]] = []
    for entry in req.inventory:
        try:
            spec = ctx.catalog.resolve(entry.gpu_type)
        except UnknownDeviceError:
            skipped.append((entry.gpu_type, "not in the GPU catalog, no estimate possible"))
            continue
        if allowed is not None and spec.key not in allowed:
            skipped.append((entry.gpu_type, "not in gpuTypes allow-list"))
            continue
        if not devices.supports_precision(spec, req.training.precision):
            skipped.append((entry.gpu_type, f"no {req.training.precision} math on {spec.key} "
                            f"(precision {req.training.precision} refused)"))
            continue
        pools.append(requests.to_pool(entry, spec.key))
    return pools, skipped


_Request = TypeVar("_Request", requests.PlanRequest, requests.EstimateRequest)


def with_graph(req: _Request, *, export_batch: int | None = None) -> _Request:
    """`req` with its model as ONNX bytes: a Hugging Face config becomes its graph
    (`graph.exporting`), built at `export_batch` (default: the request's batch) and the
    `sequence` dim."""
    if req.model_hf_config is None:
        return req
    t = req.training
    model = exporting.hf_config_graph(req.model_hf_config, batch=export_batch or t.batch_size,
                                      sequence=t.dims.get(batching.SEQUENCE_DIM),
                                      label="model_hf_config")
    return dataclasses.replace(req, model_onnx=model, model_hf_config=None)


def plan_request(req: requests.PlanRequest, ctx: PlannerContext, *,
                 max_candidates: int | None = 20) -> dict[str, Any]:
    """Plan JSON for a request, with notes; NoFeasiblePlanError listing why none fits.

    `max_candidates` bounds the ranked candidates listed (None: every one).
    """
    # A plan estimates many batches, re-batching one graph: an export at batch 1 re-batches up
    # cleanly, while one at a large batch keeps it in constants (measured: LLaMA exported at
    # 512 and re-batched to 1 came out 200x slower and larger than exported at 1).
    req = with_graph(req, export_batch=1)
    pools, skipped = _pools(req, ctx)
    if not pools:
        raise NoFeasiblePlanError("no usable GPU type in the inventory", skipped)
    specs = [ctx.catalog.resolve(k) for k in dict.fromkeys(p.device_key for p in pools)]
    shape = placement.TrainingShape(req.training.batch_size, req.training.steps_per_epoch,
                                    req.training.epochs)
    graph_at_batch = graph_at(req.model_onnx, req.training, req.training.batch_size)
    facts = model_facts.model_facts(graph_at_batch,
                                    training_settings(req.training, req.training.batch_size))
    result = placement.plan(step_profiles(req, specs, ctx), pools, shape, req.objective,
                            ctx.scaling, facts)
    if result.chosen is None:
        raise NoFeasiblePlanError("no GPU type and count satisfies the request",
                                  [*skipped, *result.reasons_by_type.items()])
    out = plan_json(result, max_candidates=max_candidates)
    out["candidates_total"] = len(result.candidates)
    out["scaling"] = ctx.scaling_fit.as_dict()
    out["notes"] = [f"{t}: {why}" for t, why in skipped]
    out["attention"] = attention_report(graph_at_batch, req.training.attention).as_dict()
    out["warnings"] = export_checks.training_warnings(req.training.mode,
                                                      graph_at_batch.folded_batchnorm)
    return out


WORKLOAD_KEY = "_workload"
"""Where `plan_with_workload` puts the workload: {"id", "zstd_b64", "device", "gpu_count"} or
{"skipped": why}. The service takes it out before answering (it is not part of the plan)."""


def plan_with_workload(req: requests.PlanRequest, ctx: PlannerContext, *,
                       max_candidates: int | None = 20) -> dict[str, Any]:
    """`plan_request`, plus the chosen candidate's workload under `WORKLOAD_KEY` for the
    promotion gate (`planning.workloads`). A workload that cannot be kept (over the size cap,
    or an error building it) is a `skipped` reason, never a failed plan."""
    req = with_graph(req, export_batch=1)
    out = plan_request(req, ctx, max_candidates=max_candidates)
    try:
        workload = plan_workload(req, ctx, out["plan"])
        workload_id, data = workloads.encode(workload)
    except workloads.WorkloadTooLargeError as exc:
        out[WORKLOAD_KEY] = {"skipped": str(exc)}
        return out
    except Exception as exc:  # the plan stands; only the gate loses this job
        log.exception("keeping the plan's workload failed")
        out[WORKLOAD_KEY] = {"skipped": f"building the workload failed: "
                                        f"{type(exc).__name__}: {str(exc)[:300]}"}
        return out
    out[WORKLOAD_KEY] = {"id": workload_id, "zstd_b64": base64.b64encode(data).decode("ascii"),
                         "device": workload.device, "gpu_count": workload.gpu_count}
    return out


def plan_workload(req: requests.PlanRequest, ctx: PlannerContext,
                  plan: Mapping[str, Any]) -> workloads.Workload:
    """The chosen candidate's workload: the step's work items at the batch one GPU runs per
    micro-step (the plan's micro_batch, else its per-GPU batch), priced by `ctx.predictor` on
    the candidate's device for the reference step (`workloads.Workload`)."""
    t = req.training
    parallel = plan.get("parallelism")
    batch = int(parallel["micro_batch"]) if isinstance(parallel, Mapping) \
        else int(plan["per_gpu_batch"])
    g = graph_at(req.model_onnx, t, batch)
    items = workloads.distinct_items(build_step(g, training_settings(t, batch)).items)
    spec = ctx.catalog.resolve(str(plan["device"]))
    return workloads.Workload(
        device=spec.key, gpu_count=int(plan["gpu_count"]), batch_size=batch,
        global_batch=t.batch_size, precision=t.precision, mode=t.mode, optimizer=t.optimizer,
        steps=int(plan["steps"]), planned_seconds=workloads.planned_seconds(plan),
        bundle_share=workloads.bundle_share(plan),
        reference_step_ms=workloads.step_ms(items, ctx.predictor, spec), items=items,
        bundle_version=selection.bundle_version_of(ctx.predictor_source))


def estimate_request(req: requests.EstimateRequest, ctx: PlannerContext) -> dict[str, Any]:
    """Estimate JSON of the request's model on the requested (or all) catalog devices."""
    req = with_graph(req)
    t = req.training
    # Named devices are checked by `estimate` (a refusal names the device); of the whole
    # catalog, those without the precision's math are left out.
    specs = ([ctx.catalog.resolve(n) for n in req.devices] if req.devices
             else [d for d in ctx.catalog.devices if devices.supports_precision(d, t.precision)])
    g = graph_at(req.model_onnx, t, t.batch_size)
    results = estimates.estimate(g, specs, training_settings(t, t.batch_size),
                                    predictor=ctx.predictor, epochs=t.epochs,
                                    dataset_size=t.dataset_size, host_probes=ctx.host_probes)
    return estimates.to_json(g, results, training_settings(t, t.batch_size),
                                predictor_source=ctx.predictor_source, epochs=t.epochs,
                                dataset_size=t.dataset_size, calibration=ctx.calibration)


def candidate_json(c: placement.Candidate) -> dict[str, Any]:
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


def _setup_json(c: placement.Candidate) -> dict[str, Any]:
    """How the candidate runs: layout, memory strategy, memory by part, step time by part."""
    if c.layout is None or c.strategy is None or c.memory is None:
        return {}
    return {
        "parallelism": {"dp": c.layout.dp, "tp": c.layout.tp, "pp": c.layout.pp,
                        "micro_batches": c.layout.micro_batches, "micro_batch": c.micro_batch},
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
        "schema_version": estimates.SCHEMA_VERSION,
        "plan": candidate_json(result.chosen) if result.chosen else None,
        "candidates": [candidate_json(c) for c in result.candidates[:max_candidates]],
        "rejected": [
            {"gpu_type": r.gpu_type, "gpu_count": r.gpu_count, "reason": r.reason}
            for r in result.rejected
        ],
        "reasons_by_type": dict(result.reasons_by_type),
    }
