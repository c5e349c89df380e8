"""How a job runs on `n` GPUs of one type: the parallel layout and memory strategy the planner
picks, with its per-GPU memory and step time (pure).

For each layout (dp, tp, pp, micro-batches; `layouts.layouts`) every memory strategy
(`strategies.candidate_strategies`, plus ZeRO-1 under accumulation) that fits the GPU is timed,
and the fastest setup of all wins. Plain data parallelism is one
layout among them (tp = pp = 1, micro-batches = the strategy's gradient accumulation). Tensor
and pipeline layouts are tried only for models whose blocks and widths the graph shows
(`ModelFacts.dims`), with the strategies Megatron-style training uses beside them (none,
ZeRO-1, activation checkpointing).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.parallel import experts, layouts, strategies, strategy_time
from gpuplan_estimator.parallel.experts import ExpertDims
from gpuplan_estimator.parallel.layouts import ModelDims, ParallelLayout, SingleGpuSplit
from gpuplan_estimator.parallel.scaling import ScalingModel
from gpuplan_estimator.parallel.sharding import ShardedMemory
from gpuplan_estimator.parallel.strategies import NO_STRATEGY, MemoryStrategy
from gpuplan_estimator.step import memory
from gpuplan_estimator.step.decomposition import TrainingSettings

MODEL_PARALLEL_STRATEGIES = (
    NO_STRATEGY, MemoryStrategy(zero_stage=1), MemoryStrategy(checkpointing="full"),
    MemoryStrategy(zero_stage=1, checkpointing="full"))
"""Beside tensor/pipeline parallelism: Megatron's distributed optimizer and recomputation."""
PIPELINE_MICRO_BATCH_FACTORS = (1, 2, 4, 8)
"""Micro-batches per step tried for pp stages: pp x these (fewer bubbles, smaller batches)."""

SIMPLER_WINS_WITHIN = 0.02
"""A later setup (more sharding, accumulation, model parallelism) replaces an earlier one only
when its step is more than 2 % faster: within the model's error, the simpler one to run wins."""

EXPOSED_COMM_KINDS = (*strategy_time.COLLECTIVE_KINDS, "p2p", "all-to-all")
"""The collectives a step's exposed communication is split by: the strategies', the
pipeline's point-to-point sends and expert parallelism's token all-to-alls."""

MemoryFn = Callable[[int, MemoryStrategy, ParallelLayout, int], ShardedMemory]
"""(micro-batch, strategy, layout, GPUs per node) → per-GPU memory; built from the graph by
the planner, cached by micro-batch there."""
StepFn = Callable[[int], tuple[float, float, float]]
"""micro-batch → (forward, backward, optimizer) ms of one GPU's whole-model step."""


@dataclass(frozen=True)
class ModelFacts:
    """What the search needs of the model beyond one device's step times."""

    settings: TrainingSettings  # precision, optimizer, mode (its batch is the global batch)
    parameter_count: int
    dims: ModelDims | None  # None: no transformer blocks found, data parallelism only
    memory: MemoryFn
    experts: ExpertDims | None  # None: a dense model, no expert parallelism


@dataclass(frozen=True)
class Setup:
    """One way to run the step on `layout.gpu_count` GPUs, with its memory and time."""

    layout: ParallelLayout  # micro_batches includes the strategy's gradient accumulation
    strategy: MemoryStrategy
    micro_batch: int
    memory: ShardedMemory
    step_ms: float
    backward_ms: float  # of the step, what hides the data-parallel communication
    parts_ms: dict[str, float]  # compute, recompute, tp_comm, pp_bubble, pp_p2p, dp_comm, ...
    exposed_comm_ms: dict[str, float]
    """The communication in `step_ms` by collective (`EXPOSED_COMM_KINDS`): what compute does not
    hide, each kind its share of the exposed time."""


@dataclass(frozen=True)
class NoSetup:
    """Nothing fits: the leanest setup tried, to say by how much."""

    leanest: ShardedMemory
    layout: ParallelLayout


def search(*, n: int, gpus_per_node: int, global_batch: int, device: DeviceSpec,
           facts: ModelFacts, step_at: StepFn, split: SingleGpuSplit | None,
           scaling: ScalingModel, comm_factor: float = 1.0) -> Setup | NoSetup | None:
    """The fastest setup of `n` GPUs that fits `device`'s memory (every strategy that fits is
    timed, for every layout; see the module docstring);
    None when no layout of `n` GPUs splits the batch evenly.

    `comm_factor` scales communication as the calibration scales compute.
    """
    best: Setup | None = None
    leanest: tuple[ShardedMemory, ParallelLayout] | None = None
    for layout, choices in _layouts(n, gpus_per_node, global_batch, facts, split):
        for strategy in choices:
            micro = global_batch // (layout.dp * layout.micro_batches
                                     * strategy.gradient_accumulation)
            full = replace(layout, micro_batches=layout.micro_batches
                           * strategy.gradient_accumulation)
            mem = facts.memory(micro, strategy, full, gpus_per_node)
            if leanest is None or mem.total_bytes < leanest[0].total_bytes:
                leanest = (mem, full)
            if mem.total_bytes > memory.usable_memory_bytes(device):
                continue
            # Every strategy that fits is timed: which is fastest depends on the network (ZeRO-2
            # reduces every micro-step, ZeRO-1 once per step), not only on the list's order.
            setup = timed(full, strategy, micro, mem, device=device, facts=facts,
                          step_at=step_at, split=split, scaling=scaling,
                          gpus_per_node=gpus_per_node, comm_factor=comm_factor)
            # Tried simplest first: a more involved setup must be clearly faster to win.
            if best is None or setup.step_ms < best.step_ms * (1.0 - SIMPLER_WINS_WITHIN):
                best = setup
    if best is not None:
        return best
    return NoSetup(*leanest) if leanest is not None else None


def _layouts(n: int, gpus_per_node: int, global_batch: int, facts: ModelFacts,
             split: SingleGpuSplit | None
             ) -> Iterable[tuple[ParallelLayout, tuple[MemoryStrategy, ...]]]:
    """Plain data parallelism first, then tensor/pipeline layouts when the model allows."""
    if global_batch % n == 0:
        per_gpu = global_batch // n
        yield from _with_experts(ParallelLayout(dp=n, tp=1, pp=1, micro_batches=1),
                                 _dp_strategies(facts.settings, per_gpu, n, gpus_per_node),
                                 facts)
    if facts.dims is None or split is None or n == 1 or not facts.settings.training:
        return
    for layout in layouts.layouts(n, gpus_per_node, global_batch,
                                      max_tp=min(gpus_per_node, n), dims=facts.dims):
        if layout.tp == 1 and layout.pp == 1:
            continue  # data parallelism, above
        wanted = {layout.pp * f for f in PIPELINE_MICRO_BATCH_FACTORS} if layout.pp > 1 else {1}
        if layout.micro_batches in wanted:
            yield from _with_experts(layout, MODEL_PARALLEL_STRATEGIES, facts)


def _with_experts(layout: ParallelLayout, choices: tuple[MemoryStrategy, ...],
                  facts: ModelFacts
                  ) -> Iterable[tuple[ParallelLayout, tuple[MemoryStrategy, ...]]]:
    """`layout`, then, training a mixture of experts, each expert-parallel degree that divides
    E and dp, with the strategies EP is priced beside (ZeRO-3/FSDP's expert parameter
    gathers are not modelled, `parallel.named`)."""
    yield layout, choices
    if facts.experts is None or not facts.settings.training:
        return
    unsharded = tuple(s for s in choices if not s.shards_parameters)
    for ep in experts.expert_degrees(facts.experts.experts, layout.dp):
        yield replace(layout, ep=ep), unsharded


@functools.lru_cache(maxsize=4096)
def _dp_strategies(settings: TrainingSettings, per_gpu: int, dp: int, gpus_per_node: int
                   ) -> tuple[MemoryStrategy, ...]:
    if not settings.training:
        return (NO_STRATEGY,)
    listed = strategies.candidate_strategies(per_gpu_batch=per_gpu, data_parallel=dp,
                                             gpus_per_node=min(gpus_per_node, dp))
    if dp == 1:
        return listed
    # ZeRO-1 with accumulation reduces gradients once per step, ZeRO-2 every micro-step: across
    # nodes the first is often much faster, so both are tried.
    zero_one = tuple(replace(s, zero_stage=1) for s in listed
                     if s.zero_stage == 2 and s.fsdp == "none" and not s.offload_optimizer)
    return tuple(dict.fromkeys(listed + zero_one))


def timed(layout: ParallelLayout, strategy: MemoryStrategy, micro: int, mem: ShardedMemory,
          *, device: DeviceSpec, facts: ModelFacts, step_at: StepFn,
          split: SingleGpuSplit | None, scaling: ScalingModel, gpus_per_node: int,
          comm_factor: float) -> Setup:
    """The step of `layout` (its micro_batches including accumulation) under `strategy` at
    micro-batch `micro`: what `search` ranks, and what a named layout is priced by."""
    forward, backward, optimizer = step_at(micro)
    if layout.tp == 1 and layout.pp == 1:
        return _data_parallel(layout, strategy, micro, mem, forward, backward, optimizer,
                              facts=facts, device=device, scaling=scaling,
                              gpus_per_node=gpus_per_node, comm_factor=comm_factor)
    assert split is not None and facts.dims is not None  # _layouts yields none otherwise
    moved = layouts.with_step(split, batch=micro, forward_ms=forward, backward_ms=backward,
                                  optimizer_ms=optimizer)
    step = layouts.step_time(layout, moved, facts.dims, device,
                                 _scaled_comm(scaling, comm_factor),
                                 gpus_per_node=gpus_per_node,
                                 recompute_fraction=strategy.checkpointed_fraction,
                                 experts=facts.experts)
    forward_share = forward / (forward + backward) if forward + backward > 0 else 0.0
    optimizer_ms = step.optimizer_ms / (layout.dp if strategy.shards_optimizer_state else 1)
    if layout.ep > 1 and facts.experts is not None and not strategy.shards_optimizer_state:
        # Unsharded, a rank updates its 1/ep of the experts (sharded: 1/dp of them either way).
        optimizer_ms *= facts.experts.local_parameter_fraction(layout.ep)
    total = step.total_ms - step.optimizer_ms + optimizer_ms
    parts = {"compute": step.compute_ms, "recompute": step.recompute_ms,
             "tp_comm": step.tp_comm_ms,
             "pp_bubble": step.pp_bubble_ms, "pp_p2p": step.pp_p2p_ms,
             "dp_comm": step.dp_allreduce_ms, "ep_comm": step.ep_alltoall_ms,
             "optimizer": optimizer_ms}
    # Megatron's TP collectives are all-reduces; the DP gradients an all-reduce, or under
    # ZeRO-1 its two halves (reduce-scatter of gradients, all-gather of parameters, §7.2).
    dp_kinds = ({"reduce-scatter": 0.5, "all-gather": 0.5} if strategy.shards_optimizer_state
                else {"all-reduce": 1.0})
    exposed = {kind: 0.0 for kind in EXPOSED_COMM_KINDS}
    exposed["all-reduce"] += step.tp_comm_ms
    exposed["p2p"] += step.pp_p2p_ms
    exposed["all-to-all"] += step.ep_alltoall_ms
    for kind, share in dp_kinds.items():
        exposed[kind] += share * step.dp_allreduce_ms
    return Setup(layout, strategy, micro, mem, total,
                 step.compute_ms * (1.0 - forward_share), parts, exposed)


def priced(layout: ParallelLayout, strategy: MemoryStrategy, micro: int, gpus_per_node: int,
           *, device: DeviceSpec, facts: ModelFacts, step_at: StepFn,
           split: SingleGpuSplit | None, scaling: ScalingModel, comm_factor: float) -> Setup:
    """One named setup's memory and step, whether it fits or not (`timed`)."""
    mem = facts.memory(micro, strategy, layout, gpus_per_node)
    return timed(layout, strategy, micro, mem, device=device, facts=facts, step_at=step_at,
                 split=split, scaling=scaling, gpus_per_node=gpus_per_node,
                 comm_factor=comm_factor)


def _data_parallel(layout: ParallelLayout, strategy: MemoryStrategy, micro: int,
                   mem: ShardedMemory, forward: float, backward: float, optimizer: float, *,
                   facts: ModelFacts, device: DeviceSpec, scaling: ScalingModel,
                   gpus_per_node: int, comm_factor: float) -> Setup:
    t = strategy_time.time_overheads(
        strategy_time.StepSplit(forward, backward, optimizer), strategy,
        settings=facts.settings, parameter_count=facts.parameter_count,
        data_parallel=layout.dp, gpus_per_node=min(gpus_per_node, layout.dp),
        expert_parallel=layout.ep,
        expert_fraction=facts.experts.expert_fraction if facts.experts else 0.0)
    comm = comm_factor * sum(collective_ms(c, scaling, gpus_per_node=gpus_per_node,
                                           intra_node_gbps=device.interconnect_gbps)
                             for c in t.collectives)
    # What backward (and, with parameter gathers, forward) computes while communicating.
    hidden_behind = t.backward_ms + (t.forward_ms if strategy.shards_parameters else 0.0)
    exposed = max(0.0, comm - scaling.overlap * hidden_behind)
    # The experts' all-to-alls sit between the layers' compute: none of them is hidden.
    alltoall = t.micro_steps * layouts.alltoall_per_micro_batch_ms(
        layout, facts.experts, micro, element_bytes=facts.settings.activation_bytes,
        device=device, scaling=_scaled_comm(scaling, comm_factor), gpus_per_node=gpus_per_node,
        order=layouts.DEFAULT_RANK_ORDER)
    parts = {"compute": t.forward_ms + t.backward_ms, "recompute": t.recompute_ms,
             "dp_comm": exposed, "ep_comm": alltoall,
             "optimizer": t.optimizer_ms + t.host_optimizer_ms, "offload_copies": t.pcie_ms}
    by_kind = _exposed_by_kind(t.collectives, exposed, scaling, gpus_per_node=gpus_per_node,
                               intra_node_gbps=device.interconnect_gbps)
    by_kind["all-to-all"] += alltoall
    return Setup(layout, strategy, micro, mem, t.compute_ms + exposed + alltoall,
                 t.backward_ms, parts, by_kind)


def _exposed_by_kind(collectives: Iterable[strategy_time.Collective], exposed_ms: float,
                     scaling: ScalingModel, *, gpus_per_node: int, intra_node_gbps: float
                     ) -> dict[str, float]:
    """`exposed_ms` shared among the collectives' kinds by each kind's time."""
    by_kind = {kind: 0.0 for kind in EXPOSED_COMM_KINDS}
    for c in collectives:
        by_kind[c.kind] += collective_ms(c, scaling, gpus_per_node=gpus_per_node,
                                         intra_node_gbps=intra_node_gbps)
    total = sum(by_kind.values())
    return {kind: exposed_ms * ms / total if total > 0 else 0.0 for kind, ms in by_kind.items()}


def collective_ms(c: strategy_time.Collective, scaling: ScalingModel, *, gpus_per_node: int,
                  intra_node_gbps: float) -> float:
    """Time of a strategy's collective, `count` times: a ring all-reduce as `scaling` prices
    it; a reduce-scatter or an all-gather moves half of that (one of its two phases)."""
    ring = scaling.allreduce_ms(gradient_bytes=c.payload_bytes, gpu_count=c.group_size,
                                gpus_per_node=max(1, gpus_per_node // c.stride),
                                intra_node_gbps=intra_node_gbps)
    return c.count * (ring if c.kind == "all-reduce" else ring / 2.0)


def _scaled_comm(scaling: ScalingModel, factor: float) -> ScalingModel:
    """`scaling` with communication `factor` times slower (the calibration's)."""
    if factor == 1.0:
        return scaling
    return replace(scaling, bandwidth_efficiency=scaling.bandwidth_efficiency / factor,
                   hop_latency_us=scaling.hop_latency_us * factor)
