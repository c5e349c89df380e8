"""Pure planner: step profiles per GPU type + cluster inventory + objective → ranked plans.

Data parallel only: each of `n` GPUs runs `global_batch / n` samples per step (a batch that does
not split evenly is rejected), then the gradients are ring-all-reduced. Every candidate that is
not chosen keeps the reason why; one without a known price is never ranked as free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuplan_estimator.core import options
from gpuplan_estimator.core.durations import format_duration
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.parallel import named, setups
from gpuplan_estimator.parallel.layouts import ParallelLayout, SingleGpuSplit
from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.parallel.sharding import ShardedMemory
from gpuplan_estimator.parallel.strategies import MemoryStrategy
from gpuplan_estimator.planning import calibrating

OBJECTIVES = options.OBJECTIVES


@dataclass(frozen=True)
class StepPoint:
    """A single-GPU estimate of one training step at `per_gpu_batch` samples."""

    per_gpu_batch: int
    forward_ms: float
    backward_ms: float
    optimizer_ms: float
    memory_bytes: int
    p10_ms: float
    p90_ms: float
    activation_bytes: int = 0  # the part of memory_bytes that grows with the batch

    @property
    def step_time_ms(self) -> float:
        """Forward + backward + optimizer time of one step in ms."""
        return self.forward_ms + self.backward_ms + self.optimizer_ms


@dataclass(frozen=True)
class StepProfile:
    """Step cost of one device type as a function of per-GPU batch.

    Built from one or two measured-shape estimates; between them time and memory are linear in
    the batch (both are sums of per-sample work plus a fixed part), outside them they are
    extrapolated linearly from the same two points.
    """

    device_key: str
    memory_capacity_bytes: int
    gradient_bytes: int  # bytes all-reduced per step
    price_per_gpu_hour_usd: float | None  # None: no known price (never taken as free)
    interconnect_gbps: float
    points: tuple[StepPoint, ...]
    predictor: str = ""
    data_basis: str = ""
    """What the figures rest on (`latency.basis`: measured, probed, extrapolated, roofline)."""
    calibration: calibrating.Correction = calibrating.IDENTITY
    """The correction already applied to `points`; `evaluate` applies it to the all-reduce."""
    device: DeviceSpec | None = None
    """The catalog entry (memory, interconnect); needed to search layouts and strategies."""
    split: SingleGpuSplit | None = None
    """The step cut into the regions tensor/pipeline parallelism sees; None: no blocks."""

    def at(self, per_gpu_batch: int) -> StepPoint:
        """The step at `per_gpu_batch`: a stored point, else interpolated between the two
        stored points around it; below the smallest it scales that one proportionally, above
        the largest it extrapolates the last two linearly (never below zero)."""
        pts = sorted(self.points, key=lambda p: p.per_gpu_batch)
        exact = [p for p in pts if p.per_gpu_batch == per_gpu_batch]
        if exact:
            return exact[0]
        if len(pts) == 1 or per_gpu_batch < pts[0].per_gpu_batch:
            # Proportional: a linear fit through larger batches can reach zero or below here.
            near = pts[0]
            return _scaled(near, per_gpu_batch, per_gpu_batch / near.per_gpu_batch)
        above = [p for p in pts if p.per_gpu_batch > per_gpu_batch]
        hi = above[0] if above else pts[-1]
        lo = pts[pts.index(hi) - 1]
        t = (per_gpu_batch - lo.per_gpu_batch) / (hi.per_gpu_batch - lo.per_gpu_batch)
        return _interpolated(lo, hi, per_gpu_batch, t)


def _scaled(p: StepPoint, batch: int, frac: float) -> StepPoint:
    return StepPoint(
        per_gpu_batch=batch,
        forward_ms=p.forward_ms * frac,
        backward_ms=p.backward_ms * frac,
        optimizer_ms=p.optimizer_ms,  # optimizer work does not depend on the batch
        memory_bytes=p.memory_bytes + math.ceil(p.activation_bytes * (frac - 1.0)),
        activation_bytes=math.ceil(p.activation_bytes * frac),
        p10_ms=p.p10_ms * frac,
        p90_ms=p.p90_ms * frac,
    )


def _interpolated(lo: StepPoint, hi: StepPoint, batch: int, t: float) -> StepPoint:
    def lin(a: float, b: float) -> float:
        return max(0.0, a + (b - a) * t)

    return StepPoint(
        per_gpu_batch=batch,
        forward_ms=lin(lo.forward_ms, hi.forward_ms),
        backward_ms=lin(lo.backward_ms, hi.backward_ms),
        optimizer_ms=lin(lo.optimizer_ms, hi.optimizer_ms),
        memory_bytes=math.ceil(lin(lo.memory_bytes, hi.memory_bytes)),
        activation_bytes=math.ceil(lin(lo.activation_bytes, hi.activation_bytes)),
        p10_ms=lin(lo.p10_ms, hi.p10_ms),
        p90_ms=lin(lo.p90_ms, hi.p90_ms),
    )


@dataclass(frozen=True)
class GpuPool:
    """GPUs of one type in the cluster (from Node labels and allocatable)."""

    gpu_type: str  # nvidia.com/gpu.product value (or catalog key outside a cluster)
    device_key: str  # canonical catalog key
    gpus_per_node: int
    nodes: int
    free_gpus: int


@dataclass(frozen=True)
class Objective:
    """What to optimise (one of OBJECTIVES) under a GPU cap, deadline (s) and budget (USD)."""
    prefer: str = options.DEFAULT_OBJECTIVE  # one of OBJECTIVES
    max_gpus: int = 8
    deadline_seconds: float | None = None
    budget_usd: float | None = None


@dataclass(frozen=True)
class TrainingShape:
    """The job's size: global batch, steps per epoch and epochs."""
    global_batch: int
    steps_per_epoch: int
    epochs: int

    @property
    def total_steps(self) -> int:
        """Steps over all epochs."""
        return self.steps_per_epoch * self.epochs


@dataclass(frozen=True)
class PlacementCandidate:
    """One feasible GPU type x count: per-GPU batch, step split (ms), time (s), memory, cost."""
    gpu_type: str
    device_key: str
    gpu_count: int
    gpus_per_node: int
    nodes: int
    per_gpu_batch: int
    step_time_ms: float
    compute_ms: float
    allreduce_ms: float
    estimated_seconds: float
    interval_seconds: tuple[float, float]
    memory_bytes_per_gpu: int
    cost_usd: float | None  # None when the GPU type has no known price
    predictor: str = ""
    data_basis: str = ""  # the profile's `latency.basis` label
    calibration: calibrating.Correction = calibrating.IDENTITY
    steps: int = 0  # over the whole run
    forward_ms: float = 0.0  # the single-GPU step at per_gpu_batch, as planned (calibrated)
    backward_ms: float = 0.0
    optimizer_ms: float = 0.0
    gradient_bytes: int = 0  # all-reduced by data parallelism (whole model)
    intra_node_gbps: float = 0.0
    layout: ParallelLayout | None = None  # None: plain data parallelism, no strategy search
    strategy: MemoryStrategy | None = None
    micro_batch: int | None = None
    memory: ShardedMemory | None = None
    parts_ms: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Rejection:
    """A GPU type x count that was ruled out, with the reason."""
    gpu_type: str
    gpu_count: int
    reason: str
    uneven: bool = False
    """The batch does not split over this count: says nothing about the GPU type itself."""


@dataclass(frozen=True)
class Plan:
    """The planner's answer: the chosen candidate, feasible ones best first, and rejections."""
    chosen: PlacementCandidate | None
    candidates: tuple[PlacementCandidate, ...]  # feasible, best first
    rejected: tuple[Rejection, ...]
    objective: Objective
    reasons_by_type: Mapping[str, str] = field(default_factory=dict)  # why a type has no candidate


def candidate_counts(max_gpus: int, gpus_per_node: int) -> list[int]:
    """1..gpus_per_node, then whole multiples of a node (multi-node jobs take whole nodes)."""
    counts = [n for n in range(1, min(max_gpus, gpus_per_node) + 1)]
    n = 2 * gpus_per_node
    while n <= max_gpus:
        counts.append(n)
        n += gpus_per_node
    return counts


def evaluate(
    profile: StepProfile,
    pool: GpuPool,
    shape: TrainingShape,
    gpu_count: int,
    scaling: ScalingModel,
    facts: setups.ModelFacts | None = None,
    pinned: named.LayoutRequest | None = None,
) -> PlacementCandidate | Rejection:
    """Price `gpu_count` GPUs of `pool` for the job, or reject it (memory, uneven batch).

    With `facts` (the model's memory under every strategy) and the profile's device, layouts
    and memory strategies are searched (`setups`), or only the `pinned` layout priced; without
    them, plain data parallelism.
    """
    if facts is not None and profile.device is not None and pinned is not None:
        return _pinned(profile, pool, shape, gpu_count, scaling, facts, profile.device, pinned)
    if facts is not None and profile.device is not None:
        return _searched(profile, pool, shape, gpu_count, scaling, facts, profile.device)
    return _data_parallel(profile, pool, shape, gpu_count, scaling)


def step_fn(profile: StepProfile) -> setups.StepFn:
    """The profile's (forward, backward, optimizer) ms at a micro-batch: what `setups` prices
    a layout from, for a plan's search and a named layout alike."""
    def step_at(micro: int) -> tuple[float, float, float]:
        p = profile.at(micro)
        return p.forward_ms, p.backward_ms, p.optimizer_ms

    return step_at


def pinned_setup(profile: StepProfile, resolved: named.ResolvedLayout, device: DeviceSpec,
                 facts: setups.ModelFacts, scaling: ScalingModel) -> setups.Setup:
    """A named layout's setup on `profile`'s device, priced as `_searched` prices a layout the
    search tries (the same step function, split, scaling and calibration)."""
    return setups.priced(resolved.layout, resolved.strategy, resolved.micro_batch,
                         resolved.gpus_per_node, device=device, facts=facts,
                         step_at=step_fn(profile), split=profile.split, scaling=scaling,
                         comm_factor=profile.calibration.factor)


def _pinned(profile: StepProfile, pool: GpuPool, shape: TrainingShape, gpu_count: int,
            scaling: ScalingModel, facts: setups.ModelFacts, device: DeviceSpec,
            pinned: named.LayoutRequest) -> PlacementCandidate | Rejection:
    """The pinned layout on `pool`, or why it cannot run there (its node size, memory)."""
    try:
        resolved = named.resolve(replace(pinned, gpus_per_node=pool.gpus_per_node),
                                 global_batch=shape.global_batch, dims=facts.dims,
                                 training=facts.settings.training,
                                 experts=facts.experts)
    except InvalidRequestError as exc:
        return Rejection(pool.gpu_type, gpu_count, f"pinned layout: {exc.message}")
    setup = pinned_setup(profile, resolved, device, facts, scaling)
    if setup.memory.total_bytes > profile.memory_capacity_bytes:
        return Rejection(pool.gpu_type, gpu_count,
                         f"pinned layout ({resolved.layout.describe()}, "
                         f"{resolved.strategy.label}) needs "
                         f"{setup.memory.total_bytes / 2**30:.1f} GiB per GPU, has "
                         f"{profile.memory_capacity_bytes / 2**30:.1f} GiB usable")
    return _candidate(profile, pool, shape, gpu_count, setup)


def _searched(profile: StepProfile, pool: GpuPool, shape: TrainingShape, gpu_count: int,
              scaling: ScalingModel, facts: setups.ModelFacts, device: DeviceSpec
              ) -> PlacementCandidate | Rejection:
    found = setups.search(n=gpu_count, gpus_per_node=min(gpu_count, pool.gpus_per_node),
                          global_batch=shape.global_batch, device=device, facts=facts,
                          step_at=step_fn(profile), split=profile.split, scaling=scaling,
                          comm_factor=profile.calibration.factor)
    if found is None:
        return _uneven(pool, shape, gpu_count)
    if isinstance(found, setups.NoSetup):
        need_gib = found.leanest.total_bytes / 2**30
        return Rejection(pool.gpu_type, gpu_count,
                         f"needs {need_gib:.1f} GiB per GPU even with "
                         f"{found.leanest.strategy.label} ({found.layout.describe()}), has "
                         f"{profile.memory_capacity_bytes / 2**30:.1f} GiB usable")
    return _candidate(profile, pool, shape, gpu_count, found)


def _candidate(profile: StepProfile, pool: GpuPool, shape: TrainingShape, gpu_count: int,
               found: setups.Setup) -> PlacementCandidate:
    ref = profile.at(found.micro_batch)
    ratio_lo = ref.p10_ms / ref.step_time_ms if ref.step_time_ms else 1.0
    ratio_hi = ref.p90_ms / ref.step_time_ms if ref.step_time_ms else 1.0
    seconds = found.step_ms * shape.total_steps / 1000.0
    return PlacementCandidate(
        gpu_type=pool.gpu_type, device_key=pool.device_key, gpu_count=gpu_count,
        gpus_per_node=min(gpu_count, pool.gpus_per_node),
        nodes=max(1, math.ceil(gpu_count / pool.gpus_per_node)),
        per_gpu_batch=shape.global_batch // found.layout.dp,
        step_time_ms=found.step_ms,
        compute_ms=found.step_ms - found.parts_ms.get("dp_comm", 0.0),
        allreduce_ms=found.parts_ms.get("dp_comm", 0.0),
        estimated_seconds=seconds,
        interval_seconds=(seconds * min(ratio_lo, 1.0), seconds * max(ratio_hi, 1.0)),
        memory_bytes_per_gpu=found.memory.total_bytes,
        cost_usd=_cost(seconds, gpu_count, profile),
        predictor=profile.predictor, data_basis=profile.data_basis,
        calibration=profile.calibration, layout=found.layout, strategy=found.strategy,
        micro_batch=found.micro_batch,
        memory=found.memory, parts_ms=found.parts_ms,
        **_scaling_inputs(profile, shape, shape.global_batch // found.layout.dp),
    )


def _scaling_inputs(profile: StepProfile, shape: TrainingShape, per_gpu_batch: int
                    ) -> dict[str, Any]:
    """What an outcome must carry back for the scaling fit (`Candidate.steps` ...)."""
    point = profile.at(per_gpu_batch)
    return {"steps": shape.total_steps, "forward_ms": point.forward_ms,
            "backward_ms": point.backward_ms, "optimizer_ms": point.optimizer_ms,
            "gradient_bytes": profile.gradient_bytes,
            "intra_node_gbps": profile.interconnect_gbps}


def _uneven(pool: GpuPool, shape: TrainingShape, gpu_count: int) -> Rejection:
    # Data parallelism needs equal shards: a padded or ragged batch is another experiment.
    return Rejection(pool.gpu_type, gpu_count,
                     f"batch {shape.global_batch} does not split evenly over {gpu_count} "
                     f"GPUs ({shape.global_batch / gpu_count:.1f} per GPU)", uneven=True)


def _cost(seconds: float, gpu_count: int, profile: StepProfile) -> float | None:
    if profile.price_per_gpu_hour_usd is None:
        return None
    return seconds / 3600.0 * gpu_count * profile.price_per_gpu_hour_usd


def _data_parallel(profile: StepProfile, pool: GpuPool, shape: TrainingShape, gpu_count: int,
                   scaling: ScalingModel) -> PlacementCandidate | Rejection:
    """Plain data parallelism at the profile's own memory figures (no strategy search)."""
    if shape.global_batch % gpu_count:
        return _uneven(pool, shape, gpu_count)
    per_gpu_batch = shape.global_batch // gpu_count
    point = profile.at(per_gpu_batch)
    if point.memory_bytes > profile.memory_capacity_bytes:
        need_gib = point.memory_bytes / 2**30
        have_gib = profile.memory_capacity_bytes / 2**30
        return Rejection(
            pool.gpu_type, gpu_count,
            f"needs {need_gib:.1f} GiB per GPU at batch {per_gpu_batch}, has {have_gib:.1f} GiB",
        )
    nodes = max(1, math.ceil(gpu_count / pool.gpus_per_node))
    # Job outcomes measure whole jobs, network included, so the factor scales the all-reduce
    # too: the whole estimate is then exactly the model's times the factor, which is what lets
    # the estimator recover the model's own estimate from a reported outcome.
    allreduce_ms = profile.calibration.factor * scaling.allreduce_ms(
        gradient_bytes=profile.gradient_bytes,
        gpu_count=gpu_count,
        gpus_per_node=pool.gpus_per_node,
        intra_node_gbps=profile.interconnect_gbps,
    )
    step_ms = scaling.step_time_ms(
        compute_ms=point.forward_ms + point.backward_ms,
        backward_ms=point.backward_ms,
        optimizer_ms=point.optimizer_ms,
        allreduce_ms=allreduce_ms,
    )
    ratio_lo = point.p10_ms / point.step_time_ms if point.step_time_ms else 1.0
    ratio_hi = point.p90_ms / point.step_time_ms if point.step_time_ms else 1.0
    seconds = step_ms * shape.total_steps / 1000.0
    cost = _cost(seconds, gpu_count, profile)
    return PlacementCandidate(
        gpu_type=pool.gpu_type,
        device_key=pool.device_key,
        gpu_count=gpu_count,
        gpus_per_node=min(gpu_count, pool.gpus_per_node),  # GPUs each pod of the job uses
        nodes=nodes,
        per_gpu_batch=per_gpu_batch,
        step_time_ms=step_ms,
        compute_ms=point.forward_ms + point.backward_ms + point.optimizer_ms,
        allreduce_ms=allreduce_ms,
        estimated_seconds=seconds,
        interval_seconds=(seconds * min(ratio_lo, 1.0), seconds * max(ratio_hi, 1.0)),
        memory_bytes_per_gpu=point.memory_bytes,
        cost_usd=cost,
        predictor=profile.predictor,
        data_basis=profile.data_basis,
        calibration=profile.calibration,
        **_scaling_inputs(profile, shape, per_gpu_batch),
    )


def _objective_violation(c: PlacementCandidate, obj: Objective) -> str:
    if obj.deadline_seconds is not None and c.estimated_seconds > obj.deadline_seconds:
        return (f"takes {format_duration(c.estimated_seconds)}, deadline is "
                f"{format_duration(obj.deadline_seconds)}")
    if obj.budget_usd is not None and c.cost_usd is None:
        return f"no known price for {c.device_key}, so the budget of ${obj.budget_usd:.2f} " \
               "cannot be checked (give one with --prices)"
    if obj.budget_usd is not None and c.cost_usd is not None and c.cost_usd > obj.budget_usd:
        return f"costs ${c.cost_usd:.2f}, budget is ${obj.budget_usd:.2f}"
    return ""


def rank_key(c: PlacementCandidate, prefer: str) -> tuple[float, ...]:
    """Sort key of a candidate under `prefer`: lower is better, GPU count breaks the last tie.

    A candidate without a known price is never ranked as free: under the cost objectives it
    comes after every priced one (ordered by time among themselves).
    """
    unpriced = 1.0 if c.cost_usd is None else 0.0
    cost = math.inf if c.cost_usd is None else c.cost_usd
    if prefer == "fastest":
        return (c.estimated_seconds, cost, c.gpu_count)
    if prefer == "balanced":
        # Cost x time: a 2x faster plan may cost up to 2x more.
        return (unpriced, cost * c.estimated_seconds if c.cost_usd is not None
                else c.estimated_seconds, c.gpu_count)
    return (unpriced, cost if c.cost_usd is not None else c.estimated_seconds,
            c.estimated_seconds, c.gpu_count)


def plan(
    profiles: Mapping[str, StepProfile],
    pools: Sequence[GpuPool],
    shape: TrainingShape,
    objective: Objective,
    scaling: ScalingModel,
    facts: setups.ModelFacts | None = None,
    pinned: named.LayoutRequest | None = None,
) -> Plan:
    """Enumerate GPU type x count, reject with reasons, rank feasible ones by the objective.

    With `facts`, each count's layout and memory strategy are searched (`evaluate`); a
    `pinned` layout is the only one tried, at its own GPU count (it needs `facts`).
    """
    if pinned is not None and facts is None:
        raise ValueError("pinned: a pinned layout needs the model's facts")
    if objective.prefer not in OBJECTIVES:
        raise ValueError(f"objective.prefer: must be one of {', '.join(OBJECTIVES)}")
    feasible: list[PlacementCandidate] = []
    rejected: list[Rejection] = []
    by_type: dict[str, str] = {}
    for pool in pools:
        profile = profiles.get(pool.device_key)
        if profile is None:
            by_type[pool.gpu_type] = f"no estimate for device {pool.device_key}"
            continue
        type_feasible = 0
        evaluated: list[str] = []  # reasons of counts the cluster could run: the informative ones
        counts = (candidate_counts(objective.max_gpus, pool.gpus_per_node) if pinned is None
                  else [pinned.gpus] if pinned.gpus <= objective.max_gpus else [])
        if not counts and pinned is not None:
            by_type[pool.gpu_type] = (f"the pinned layout takes {pinned.gpus} GPUs, more than "
                                      f"maxGpus {objective.max_gpus}")
            continue
        for n in counts:
            if n > pool.gpus_per_node * pool.nodes:
                rejected.append(Rejection(pool.gpu_type, n, f"cluster has only "
                                          f"{pool.gpus_per_node * pool.nodes} GPUs of this type"))
                continue
            outcome = evaluate(profile, pool, shape, n, scaling, facts, pinned)
            if isinstance(outcome, Rejection):
                rejected.append(outcome)
                if not outcome.uneven:
                    evaluated.append(f"x{n}: {outcome.reason}")
                continue
            violation = _objective_violation(outcome, objective)
            if violation:
                rejected.append(Rejection(pool.gpu_type, n, violation))
                evaluated.append(f"x{n}: {violation}")
                continue
            feasible.append(outcome)
            type_feasible += 1
        if not type_feasible:
            others = [r.reason for r in rejected if r.gpu_type == pool.gpu_type]
            by_type[pool.gpu_type] = (evaluated[-1] if evaluated else others[-1] if others
                                      else "no GPU count allowed by maxGpus")
    feasible.sort(key=lambda c: rank_key(c, objective.prefer))
    return Plan(
        chosen=feasible[0] if feasible else None,
        candidates=tuple(feasible),
        rejected=tuple(rejected),
        objective=objective,
        reasons_by_type=by_type,
    )
