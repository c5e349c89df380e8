"""Glue behind the service and `gpuplan plan`: request → graph → estimates → plan (no I/O here
beyond parsing the model bytes it is handed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuplan_estimator import api, cli, devices, graph, placement
from gpuplan_estimator import calibration as calibration_mod
from gpuplan_estimator import estimate as estimate_mod
from gpuplan_estimator.errors import GpuplanError, InvalidRequestError, UnknownDeviceError
from gpuplan_estimator.predictors import LatencyPredictor
from gpuplan_estimator.scaling import ScalingModel
from gpuplan_estimator.training_step import TrainingSettings


class NoFeasiblePlanError(GpuplanError):
    """No GPU type x count satisfies memory, cluster size and the objective."""

    def __init__(self, message: str, details: Sequence[str]) -> None:
        super().__init__(f"{message}: {'; '.join(details)}" if details else message)
        self.details = tuple(details)


@dataclass(frozen=True)
class EngineContext:
    catalog: devices.Catalog
    predictor: LatencyPredictor
    predictor_source: str  # e.g. "bundle:/path (shipped)" or "roofline"
    scaling: ScalingModel = field(default_factory=ScalingModel)
    manifest: Mapping[str, Any] = field(default_factory=dict)
    calibration: calibration_mod.Calibration = field(default_factory=calibration_mod.Calibration)
    """Fitted from job outcomes by the service; identity (factor 1) when there are none."""

    def describe(self) -> dict[str, Any]:
        return {
            "predictor": self.predictor.name,
            "source": self.predictor_source,
            "manifest": dict(self.manifest),
            "devices": list(self.catalog.keys()),
        }


@dataclass(frozen=True)
class EstimateRequest:
    model_onnx: bytes
    training: api.TrainingRequest
    devices: tuple[str, ...]  # empty = every catalog device


def parse_estimate_request(body: Any) -> EstimateRequest:
    if not isinstance(body, Mapping):
        raise InvalidRequestError("body", "must be a JSON object")
    errs = api._Errors()
    model = api.decode_model(body, errs)
    training = api.parse_training(api._mapping(body, "training", errs), errs)
    names = body.get("devices") or []
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        errs.add("devices", "must be a list of device names")
        names = []
    errs.raise_if_any()
    return EstimateRequest(model, training, tuple(names))


def training_settings(t: api.TrainingRequest, batch: int) -> TrainingSettings:
    return TrainingSettings(mode=t.mode, optimizer=t.optimizer, precision=t.precision,
                            batch_size=batch)


def _estimates_at(model: bytes, t: api.TrainingRequest, batch: int,
                  specs: Sequence[devices.DeviceSpec], ctx: EngineContext
                  ) -> tuple[int, Sequence[estimate_mod.DeviceEstimate]]:
    """Estimates at `batch`. A model exported with a fixed batch is re-batched (its leading
    dim made symbolic); when that does not parse, it is estimated at its own batch and the
    planner scales per sample."""
    g = graph.load_model(model, batch=batch, dim_bindings=dict(t.dims))
    actual = cli.model_batch(g, None)
    if actual != batch:
        try:
            g = graph.load_model(graph.symbolic_batch(model), batch=batch,
                                 dim_bindings=dict(t.dims))
            actual = cli.model_batch(g, None)
        except GpuplanError:
            g = graph.load_model(model, batch=batch, dim_bindings=dict(t.dims))
    settings = training_settings(t, actual)
    return actual, estimate_mod.estimate(g, specs, settings, predictor=ctx.predictor)


def _point(e: estimate_mod.DeviceEstimate, batch: int, calibrated: calibration_mod.Calibrated
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


def _calibrated(e: estimate_mod.DeviceEstimate, cal: calibration_mod.Calibration, mode: str
                ) -> calibration_mod.Calibrated:
    p10, p90 = e.interval_ms
    return calibration_mod.calibrate(cal, e.device, mode, e.step_time_ms, p10, p90)


def step_profiles(req: api.PlanRequest, specs: Sequence[devices.DeviceSpec], ctx: EngineContext
                  ) -> dict[str, placement.StepProfile]:
    """Estimate at the largest and smallest per-GPU batch the plan can use; interpolate between.

    A model exported with a fixed batch is estimated at that batch only and scaled per sample.
    Step times are calibrated per device by `ctx.calibration`; the profile carries the
    correction so the planner scales its all-reduce by the same factor (see `placement`).
    """
    t = req.training
    mode = calibration_mod.mode_of(t.mode)
    wanted = sorted({t.batch_size, math.ceil(t.batch_size / req.objective.max_gpus)})
    by_batch = dict(_estimates_at(req.model_onnx, t, b, specs, ctx) for b in wanted)
    batches = sorted(by_batch)
    profiles = {}
    for i, spec in enumerate(specs):
        first = by_batch[batches[0]][i]
        calibrated = [_calibrated(by_batch[b][i], ctx.calibration, mode) for b in batches]
        profiles[spec.key] = placement.StepProfile(
            device_key=spec.key,
            memory_capacity_bytes=spec.memory_bytes,
            gradient_bytes=first.memory.gradients_bytes,
            price_per_gpu_hour_usd=spec.price_per_hour_usd,
            interconnect_gbps=spec.interconnect_gbps,
            points=tuple(_point(by_batch[b][i], b, c)
                         for b, c in zip(batches, calibrated, strict=True)),
            predictor=ctx.predictor_source,
            calibration=calibrated[0].correction,  # per device and mode: equal at every batch
        )
    return profiles


def _pools(req: api.PlanRequest, ctx: EngineContext) -> tuple[list[placement.GpuPool], list[str]]:
    allowed = {ctx.catalog.resolve(n).key for n in req.gpu_types} if req.gpu_types else None
    pools, notes = [], []
    for entry in req.inventory:
        try:
            spec = ctx.catalog.resolve(entry.gpu_type)
        except UnknownDeviceError:
            notes.append(f"{entry.gpu_type}: not in the GPU catalog, no estimate possible")
            continue
        if allowed is not None and spec.key not in allowed:
            notes.append(f"{entry.gpu_type}: not in gpuTypes allow-list")
            continue
        pools.append(api.to_pool(entry, spec.key))
    return pools, notes


def plan_request(req: api.PlanRequest, ctx: EngineContext) -> dict[str, Any]:
    pools, notes = _pools(req, ctx)
    if not pools:
        raise NoFeasiblePlanError("no usable GPU type in the inventory", notes)
    specs = [ctx.catalog.resolve(k) for k in dict.fromkeys(p.device_key for p in pools)]
    shape = placement.TrainingShape(req.training.batch_size, req.training.steps_per_epoch,
                                    req.training.epochs)
    result = placement.plan(step_profiles(req, specs, ctx), pools, shape, req.objective,
                            ctx.scaling)
    if result.chosen is None:
        details = notes + [f"{t}: {r}" for t, r in result.reasons_by_type.items()]
        raise NoFeasiblePlanError("no GPU type and count satisfies the request", details)
    out = api.plan_json(result)
    out["notes"] = notes
    return out


def estimate_request(req: EstimateRequest, ctx: EngineContext) -> dict[str, Any]:
    specs = ([ctx.catalog.resolve(n) for n in req.devices] if req.devices
             else list(ctx.catalog.devices))
    t = req.training
    g = graph.load_model(req.model_onnx, batch=t.batch_size, dim_bindings=dict(t.dims))
    try:
        cli.model_batch(g, t.batch_size)  # a fixed-batch model cannot run at another batch
    except InvalidRequestError as exc:
        raise InvalidRequestError("training.batch_size", str(exc).partition(": ")[2]) from exc
    results = estimate_mod.estimate(g, specs, training_settings(t, t.batch_size),
                                    predictor=ctx.predictor, epochs=t.epochs,
                                    dataset_size=t.dataset_size)
    return estimate_mod.to_json(g, results, training_settings(t, t.batch_size),
                                predictor_source=ctx.predictor_source, epochs=t.epochs,
                                dataset_size=t.dataset_size, calibration=ctx.calibration)
