"""Glue behind the service and `gpuplan plan`: request → graph → estimates → plan (no I/O here
beyond parsing the model bytes it is handed)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, TypeVar

from gpuplan_estimator import devices, graph
from gpuplan_estimator.core.errors import GpuplanError, InvalidRequestError, UnknownDeviceError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.cost.predictors import LatencyPredictor
from gpuplan_estimator.graph import batching, export_checks, exporting
from gpuplan_estimator.latency import selection
from gpuplan_estimator.parallel import layouts
from gpuplan_estimator.parallel import scaling as scaling_fits
from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.planning import (
    calibrating,
    estimates,
    model_facts,
    parallel_inputs,
    placement,
    requests,
    workloads,
)
from gpuplan_estimator.step import host, memory
from gpuplan_estimator.step.attention import AttentionReport, attention_report
from gpuplan_estimator.step.decomposition import TrainingSettings, build_step


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
    calibration: calibrating.CalibrationTable = field(default_factory=calibrating.CalibrationTable)
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
    """The request's mode, optimizer (and its implementation), precision and attention at
    batch size `batch`."""
    return TrainingSettings(mode=t.mode, optimizer=t.optimizer, precision=t.precision,
                            attention=t.attention, optimizer_impl=t.optimizer_impl,
                            batch_size=batch)


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
                  specs: Sequence[devices.DeviceSpec], ctx: PlannerContext,
                  loaded: Mapping[int, ModelGraph]
                  ) -> tuple[int, Sequence[estimates.DeviceStepEstimate]]:
    """Estimates at `batch` (`graph_at`, or the caller's graph at that batch in `loaded`)."""
    g = loaded[batch] if batch in loaded else graph_at(model, t, batch)
    return batch, estimates.estimate(g, specs, training_settings(t, batch),
                                     predictor=ctx.predictor, host_probes=ctx.host_probes)


def _point(e: estimates.DeviceStepEstimate, batch: int, calibrated: calibrating.Calibrated
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


def _calibrated(e: estimates.DeviceStepEstimate, cal: calibrating.CalibrationTable, mode: str
                ) -> calibrating.Calibrated:
    p10, p90 = e.interval_ms
    return calibrating.calibrate(cal, e.device, mode, e.step_time_ms, p10, p90)


def step_profiles(req: requests.PlanRequest, specs: Sequence[devices.DeviceSpec],
                  ctx: PlannerContext, loaded: Mapping[int, ModelGraph] = MappingProxyType({})
                  ) -> dict[str, placement.StepProfile]:
    """Estimate at the global batch, the smallest per-GPU batch and batch 1; interpolate between.

    A model exported with a fixed batch is re-batched to each, or refused (`graph_at`).
    Step times are calibrated per device by `ctx.calibration`; the profile carries the
    correction so the planner scales its all-reduce by the same factor (see `placement`).
    Each profile also carries its device and the step cut into the regions tensor and pipeline
    parallelism see (from the smaller batch's estimate; None for a model without blocks).
    """
    return profiles_at(req.model_onnx, req.training, req.objective.max_gpus, specs, ctx, loaded)


def profiles_at(model: bytes, t: requests.TrainingRequest, max_gpus: int,
                specs: Sequence[devices.DeviceSpec], ctx: PlannerContext,
                loaded: Mapping[int, ModelGraph] = MappingProxyType({})
                ) -> dict[str, placement.StepProfile]:
    """`step_profiles` of `model` for plans of up to `max_gpus` GPUs (the smallest per-GPU
    batch is the global batch over them). `loaded` holds graphs of `model` the caller has
    already bound, by batch (a 7B graph takes a second or more to load)."""
    mode = calibrating.mode_of(t.mode)
    # Micro-batches (accumulation, pipelines) reach below the smallest per-GPU batch: a point
    # at batch 1 anchors them.
    wanted = sorted({t.batch_size, math.ceil(t.batch_size / max_gpus), 1})
    by_batch = dict(_estimates_at(model, t, b, specs, ctx, loaded) for b in wanted)
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


def _split(e: estimates.DeviceStepEstimate, factor: float) -> layouts.SingleGpuSplit | None:
    """The estimate's step by region, calibrated like the points; None without blocks."""
    try:
        split = parallel_inputs.split_from_estimate(e)
    except InvalidRequestError:
        return None
    return layouts.with_step(split, batch=split.batch, forward_ms=split.forward_ms * factor,
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


@dataclass(frozen=True)
class PlannedRequest:
    """A plan request's answer as plain data: the plan and what the JSON reports beside it
    (`interfaces.json_documents.planned_json` writes it)."""
    plan: placement.Plan
    """The chosen candidate (never None here), the ranked others and every rejection."""
    scaling: scaling_fits.FittedScaling
    """Where the multi-GPU scaling model came from (fitted to outcomes or analytic)."""
    skipped: tuple[tuple[str, str], ...]
    """(GPU type, why) for each inventory entry left out before planning."""
    attention: AttentionReport
    """What the requested attention did to the model at the global batch."""
    price_notes: tuple[str, ...] = ()
    """Where the chosen GPU's price was taken and which GPUs have none (`price_notes`)."""
    warnings: tuple[str, ...] = ()
    """What the export left out that training runs (`graph.export_checks`)."""


def plan_request(req: requests.PlanRequest, ctx: PlannerContext) -> PlannedRequest:
    """The plan of a request; NoFeasiblePlanError listing why none fits."""
    # A plan estimates many batches, re-batching one graph: an export at batch 1 re-batches up
    # cleanly, while one at a large batch keeps it in constants (measured: LLaMA exported at
    # 512 and re-batched to 1 came out 200x slower and larger than exported at 1).
    req = with_graph(req, export_batch=1)
    if req.prices_provider is not None:
        ctx = dataclasses.replace(ctx, catalog=devices.price_by_provider(
            ctx.catalog, req.prices_provider, field="prices_provider"))
    pools, skipped = _pools(req, ctx)
    if not pools:
        raise NoFeasiblePlanError("no usable GPU type in the inventory", skipped)
    specs = [ctx.catalog.resolve(k) for k in dict.fromkeys(p.device_key for p in pools)]
    shape = placement.TrainingShape(req.training.batch_size, req.training.steps_per_epoch,
                                    req.training.epochs)
    graph_at_batch = graph_at(req.model_onnx, req.training, req.training.batch_size)
    facts = model_facts.model_facts(graph_at_batch,
                                    training_settings(req.training, req.training.batch_size))
    profiles = step_profiles(req, specs, ctx, {req.training.batch_size: graph_at_batch})
    result = placement.plan(profiles, pools, shape, req.objective,
                            ctx.scaling, facts, req.layout)
    if result.chosen is None:
        raise NoFeasiblePlanError("no GPU type and count satisfies the request",
                                  [*skipped, *result.reasons_by_type.items()])
    return PlannedRequest(plan=result, scaling=ctx.scaling_fit, skipped=tuple(skipped),
                          attention=attention_report(graph_at_batch, req.training.attention),
                          price_notes=tuple(price_notes(specs, result.chosen.device_key)),
                          warnings=tuple(export_checks.training_warnings(
                              req.training.mode, graph_at_batch.folded_batchnorm)))


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


@dataclass(frozen=True)
class EstimatedRequest:
    """An estimate request's answer as plain data (`interfaces.json_documents.estimated_json`)."""
    graph: ModelGraph
    results: Sequence[estimates.DeviceStepEstimate]
    settings: TrainingSettings
    predictor_source: str
    epochs: int | None
    dataset_size: int | None
    calibration: calibrating.CalibrationTable


def estimate_request(req: requests.EstimateRequest, ctx: PlannerContext) -> EstimatedRequest:
    """Estimates of the request's model on the requested (or all) catalog devices."""
    req = with_graph(req)
    t = req.training
    # Named devices are checked by `estimate` (a refusal names the device); of the whole
    # catalog, those without the precision's math are left out.
    specs = ([ctx.catalog.resolve(n) for n in req.devices] if req.devices
             else [d for d in ctx.catalog.devices if devices.supports_precision(d, t.precision)])
    g = graph_at(req.model_onnx, t, t.batch_size)
    settings = training_settings(t, t.batch_size)
    results = estimates.estimate(g, specs, settings, predictor=ctx.predictor, epochs=t.epochs,
                                 dataset_size=t.dataset_size, host_probes=ctx.host_probes)
    return EstimatedRequest(graph=g, results=results, settings=settings,
                            predictor_source=ctx.predictor_source, epochs=t.epochs,
                            dataset_size=t.dataset_size, calibration=ctx.calibration)


def price_notes(specs: Sequence[devices.DeviceSpec], chosen_key: str) -> list[str]:
    """Where the chosen GPU's price was taken, which GPUs have none, and whether the prices
    compared come from more than one source (#34)."""
    chosen = next(s for s in specs if s.key == chosen_key)
    notes = [f"price of {chosen.key}: {chosen.price_source or 'none known'}"]
    unpriced = sorted(s.key for s in specs if not s.has_price)
    if unpriced:
        notes.append(f"no price for {', '.join(unpriced)}: their cost is unknown, so "
                     "'cheapest' cannot choose them")
    if len({s.price_source for s in specs if s.has_price}) > 1:
        notes.append("the prices compared come from different sources (the catalog's "
                     "indicative ones); --prices PROVIDER compares within one provider")
    return notes
