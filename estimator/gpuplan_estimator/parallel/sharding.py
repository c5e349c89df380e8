"""Per-GPU memory under a memory-saving strategy and model parallelism (issue #19).

Plain data parallelism (no strategy, no tensor or pipeline parallelism) is
`memory.MemoryBreakdown` itself: the walked peak of a torch.amp/DDP step (issue #30). Every
other setup is counted as the ZeRO and Megatron papers count it, from the parameter count:
model states (mixed precision: half weights 2P, half gradients 2P, fp32 master weights and
optimizer state, DeepSpeed's convention) plus the tensors kept for backward, summed
(`MemoryBreakdown.saved_activations_bytes`), each part divided by the group that shares it:

- Tensor parallelism (Megatron, Shoeybi et al. 2019) and pipeline parallelism (Narayanan et
  al. SC'21) split the model states (parameters, gradients, optimizer state) over tp x pp
  ranks. We divide all of them evenly: embeddings and layer norms that Megatron replicates
  over tp, and uneven stage splits, are ignored (both small for large transformers).
- ZeRO (Rajbhandari et al. SC'20, §5.1-5.3 and Figure 1) then shards over the data-parallel
  group: stage 1 the optimizer state, which for mixed precision includes the fp32 master
  weights (ZeRO's K = 12 bytes/param for Adam = master 4 + momentum 4 + variance 4); stage 2
  also the gradients; stage 3 also the half-precision parameters. With fp32 training the
  weights are the master copy and are sharded only by stage 3. FSDP full = ZeRO-3; hybrid
  shards within a node (`strategies.shard_group_size`).
- ZeRO-3/FSDP gather parameters one unit at a time (a transformer block, FSDP's usual wrap):
  two units at compute width, since FSDP's `limit_all_gathers` lets the next unit's
  all-gather run while the current one computes.
- Offload (ZeRO-Offload, Ren et al. ATC'21 §3): optimizer state and fp32 master weights move
  to host memory (`host_bytes`); gradients stay on the GPU until copied out, so we keep them.
- Activations at the micro-batch: tensor parallelism splits them as `block_activations`
  explains (Korthikanti et al. 2022, Table 2); with sequence parallelism everything in the
  blocks is split. Full checkpointing keeps each block's input plus, during backward, one
  block's activations being recomputed; per-block checkpointing does so for the first
  fraction of the blocks. Pipeline 1F1B holds the stage's activations (1/pp of the model's)
  for up to `in_flight_micro_batches` micro-batches on the first stage (Narayanan et al. 2021
  §2.2: at most pp in flight), but recomputes only one block at a time.
- Workspace and the framework overhead stay as they were at the micro-batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from gpuplan_estimator.core import vocabulary
from gpuplan_estimator.core.errors import InvalidRequestError
from gpuplan_estimator.core.layers import ModelGraph
from gpuplan_estimator.devices.catalog import DeviceSpec
from gpuplan_estimator.parallel import block_activations, strategies
from gpuplan_estimator.parallel.block_activations import ActivationLayout
from gpuplan_estimator.parallel.strategies import NO_STRATEGY, MemoryStrategy
from gpuplan_estimator.step import memory
from gpuplan_estimator.step.decomposition import TrainingSettings

# FSDP (torch.distributed.fsdp, limit_all_gathers=True) keeps at most two all-gathered units.
GATHERED_UNITS = 2
MASTER_WEIGHT_BYTES = 4  # fp32 master copy kept by torch.amp-style mixed precision


@dataclass(frozen=True)
class ExpertShare:
    """Where a mixture of experts' states sit on a rank (`parallel.experts`)."""

    ep: int  # expert-parallel ranks (1: every rank holds every expert)
    fraction: float  # the experts' share of the model's parameters (0: dense)
    dispatch_buffers_bytes: int  # the all-to-all's buffers; 0 without EP


NO_EXPERTS = ExpertShare(ep=1, fraction=0.0, dispatch_buffers_bytes=0)


@dataclass(frozen=True)
class ShardedMemory:
    """Bytes one GPU needs for a training step under a strategy, by part (as MemoryBreakdown)."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    """Includes `recompute_bytes`."""
    workspace_bytes: int
    framework_overhead_bytes: int
    gathered_parameters_bytes: int
    """ZeRO-3/FSDP: full parameters of the units gathered at once."""
    recompute_bytes: int
    """Checkpointing: one block's activations rebuilt during backward (part of activations)."""
    host_bytes: int
    """Offload: optimizer state and master weights held in host memory (not in the total)."""
    expert_states_bytes: int
    """Mixture of experts: the experts' weights, gradients and optimizer state on this rank
    (part of the first three parts; 1/ep of the model's under expert parallelism)."""
    dispatch_buffers_bytes: int
    """Expert parallelism: the all-to-all's send and receive buffers of one MoE layer."""
    micro_batch: int
    strategy: MemoryStrategy

    @property
    def total_bytes(self) -> int:
        """GPU bytes: every part but host memory."""
        return (self.parameters_bytes + self.gradients_bytes + self.optimizer_state_bytes
                + self.activations_bytes + self.workspace_bytes
                + self.framework_overhead_bytes + self.gathered_parameters_bytes
                + self.dispatch_buffers_bytes)

    def fits(self, device: DeviceSpec) -> bool:
        """Whether the GPU total fits in what the device gives a process."""
        return self.total_bytes <= memory.usable_memory_bytes(device)

    def as_dict(self) -> dict[str, int]:
        """Every part and the total, in bytes (MemoryBreakdown's keys plus the new parts)."""
        return {part: getattr(self, part) for part in vocabulary.SHARDED_MEMORY_PARTS} | {
            vocabulary.MEMORY_TOTAL: self.total_bytes}


def memory_under(
    breakdown_at_micro_batch: memory.MemoryBreakdown,
    strategy: MemoryStrategy,
    *,
    settings: TrainingSettings,
    data_parallel: int,
    gpus_per_node: int,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    in_flight_micro_batches: int = 1,
    sequence_parallel: bool = False,
    layout: ActivationLayout | None = None,
    experts: ExpertShare = NO_EXPERTS,
) -> ShardedMemory:
    """Per-GPU bytes of a step under `strategy`, tp x pp model parallelism and `experts.ep`
    expert parallelism.

    `breakdown_at_micro_batch` is `memory.training_memory` at the micro-batch (per-GPU batch /
    gradient accumulation) for the whole model; `settings` the precision it was built with.
    `layout` (at the same batch) is needed for checkpointing, tensor parallelism and ZeRO-3/FSDP.
    """
    strategy.check()
    settings.check()
    _check_counts(data_parallel=data_parallel, gpus_per_node=gpus_per_node,
                  tensor_parallel=tensor_parallel, pipeline_parallel=pipeline_parallel,
                  in_flight_micro_batches=in_flight_micro_batches)
    _check_inputs(breakdown_at_micro_batch, strategy, layout, tensor_parallel=tensor_parallel,
                  pipeline_parallel=pipeline_parallel,
                  in_flight_micro_batches=in_flight_micro_batches)
    m = breakdown_at_micro_batch
    if (strategy == NO_STRATEGY and tensor_parallel == 1 and pipeline_parallel == 1
            and not sequence_parallel):  # the walked peak (with EP, its experts' states 1/ep)
        return _plain(m, experts)
    shard = strategies.shard_group_size(strategy, data_parallel=data_parallel,
                                        gpus_per_node=gpus_per_node,
                                        tensor_parallel=tensor_parallel)
    states = _model_states(m, strategy, settings, shard=shard,
                           model_split=tensor_parallel * pipeline_parallel, experts=experts)
    gathered = 0
    if strategy.shards_parameters and layout is not None and shard > 1:
        unit = layout.gather_unit_parameter_count * settings.activation_bytes
        gathered = GATHERED_UNITS * math.ceil(unit / tensor_parallel)
    activations, recompute = _activation_bytes(
        m.saved_activations_bytes, layout, strategy, tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel, in_flight=in_flight_micro_batches,
        sequence_parallel=sequence_parallel)
    parts = {"parameters_bytes": states.parameters_bytes,
             "gradients_bytes": states.gradients_bytes,
             "optimizer_state_bytes": states.optimizer_state_bytes,
             "activations_bytes": activations, "workspace_bytes": m.workspace_bytes,
             "gathered_parameters_bytes": gathered,
             "dispatch_buffers_bytes": experts.dispatch_buffers_bytes}
    return ShardedMemory(
        **parts,
        expert_states_bytes=states.expert_states_bytes,
        # the allocator's reserve follows this setup's own allocated bytes
        framework_overhead_bytes=memory.framework_overhead_bytes(sum(parts.values())),
        recompute_bytes=recompute,
        host_bytes=states.host_bytes,
        micro_batch=m.per_gpu_batch,
        strategy=strategy,
    )


@dataclass(frozen=True)
class _ModelStates:
    """One rank's model states, by part, in bytes."""

    parameters_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    host_bytes: int
    expert_states_bytes: int  # of the first three


def _model_states(m: memory.MemoryBreakdown, strategy: MemoryStrategy,
                  settings: TrainingSettings, *, shard: int, model_split: int,
                  experts: ExpertShare) -> _ModelStates:
    """Weights, gradients and optimizer state split over tp x pp, each part then sharded
    over the `shard` ranks of ZeRO/FSDP when the strategy shards it."""
    state_shard = shard if strategy.shards_optimizer_state else 1
    grad_shard = shard if strategy.shards_gradients else 1
    param_shard = shard if strategy.shards_parameters else 1

    def rank(n: int, group: int) -> tuple[int, int]:
        return _rank_bytes(n, group, model_split=model_split, experts=experts)

    p = m.parameter_count
    master = _master_weight_bytes(m, settings)
    working = p * (settings.activation_bytes if settings.mixed_precision else 4)
    state = 4 * p * memory.OPTIMIZER_STATE_WORDS[settings.optimizer]
    host = 0
    if strategy.offload_optimizer:
        # ZeRO-Offload: state and master weights on the CPU; with fp32 the CPU updates its
        # own copy of the weights and sends them back, so the host holds them too.
        host = rank(state, state_shard)[0] + rank(master or working, state_shard)[0]
        state, master = 0, 0
    weights, masters = rank(working, param_shard), rank(master, state_shard)
    grads, states = rank(working, grad_shard), rank(state, state_shard)
    return _ModelStates(
        parameters_bytes=weights[0] + masters[0], gradients_bytes=grads[0],
        optimizer_state_bytes=states[0], host_bytes=host,
        expert_states_bytes=weights[1] + masters[1] + grads[1] + states[1])


def _check_inputs(breakdown: memory.MemoryBreakdown, strategy: MemoryStrategy,
                  layout: ActivationLayout | None, *, tensor_parallel: int,
                  pipeline_parallel: int, in_flight_micro_batches: int) -> None:
    """What `memory_under` needs beyond valid counts: a 1F1B depth the pipeline allows, and
    the activation layout, at the breakdown's batch, wherever blocks matter."""
    if in_flight_micro_batches > pipeline_parallel:
        raise InvalidRequestError("in_flight_micro_batches", f"1F1B keeps at most "
                                  f"pipeline_parallel={pipeline_parallel} micro-batches in "
                                  f"flight, got {in_flight_micro_batches}")
    needs_layout = (strategy.checkpointing != "none" or tensor_parallel > 1
                    or strategy.shards_parameters)
    if needs_layout and layout is None:
        raise InvalidRequestError("layout", "checkpointing, tensor parallelism and ZeRO-3/FSDP "
                                  "need the activation layout by block")
    if layout is not None and layout.per_gpu_batch != breakdown.per_gpu_batch:
        raise InvalidRequestError("layout", f"built at batch {layout.per_gpu_batch}, the "
                                  f"breakdown at {breakdown.per_gpu_batch}")


def strategy_memory(
    graph: ModelGraph,
    settings: TrainingSettings,
    strategy: MemoryStrategy,
    *,
    data_parallel: int,
    gpus_per_node: int,
    block_of: Callable[[str], str],
    outside_label: str,
    tensor_parallel: int = 1,
    pipeline_parallel: int = 1,
    in_flight_micro_batches: int = 1,
    sequence_parallel: bool = False,
) -> ShardedMemory:
    """`memory_under` from a graph built at the global batch `settings.batch_size`.

    The per-GPU batch is ceil(global / data_parallel), as in `memory.training_memory`; the
    accumulation steps must divide it (`strategies.micro_batch_size`).
    """
    strategy.check()
    _check_counts(data_parallel=data_parallel)
    per_gpu = math.ceil(settings.batch_size / data_parallel)
    micro = strategies.micro_batch_size(per_gpu, strategy)
    # ceil(ceil(B/d)/k) = ceil(B/(d·k)): the breakdown at d·k "replicas" is the micro-batch's.
    breakdown = memory.training_memory(
        graph, settings, data_parallel=data_parallel * strategy.gradient_accumulation)
    layout = block_activations.activation_layout(
        graph, settings, block_of=block_of, outside_label=outside_label).at_batch(micro)
    return memory_under(
        breakdown, strategy, settings=settings, data_parallel=data_parallel,
        gpus_per_node=gpus_per_node, tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel, in_flight_micro_batches=in_flight_micro_batches,
        sequence_parallel=sequence_parallel, layout=layout)


def _rank_bytes(n: int, group: int, *, model_split: int, experts: ExpertShare
                ) -> tuple[int, int]:
    """(bytes on a rank, of which the experts') of model state `n` split over tp x pp, then
    over `group` data-parallel ranks (1: unsharded). Under EP an unsharded expert state is 1/ep
    on a rank; a ZeRO-sharded one is spread over dp = ep x dp/ep ranks with or without EP."""
    expert = n * experts.fraction
    if experts.ep == 1:
        return math.ceil(n / model_split / group), math.ceil(expert / model_split / group)
    per_rank = model_split * group
    expert_local = math.ceil(expert / (per_rank if group > 1 else model_split * experts.ep))
    return math.ceil((n - expert) / per_rank) + expert_local, expert_local


def _plain(m: memory.MemoryBreakdown, experts: ExpertShare) -> ShardedMemory:
    """Plain data parallelism: the walked peak, part by part (the experts' states 1/ep)."""
    params, grads, state = (_rank_bytes(n, 1, model_split=1, experts=experts) for n in (
        m.parameters_bytes, m.gradients_bytes, m.optimizer_state_bytes))
    return ShardedMemory(
        parameters_bytes=params[0], gradients_bytes=grads[0], optimizer_state_bytes=state[0],
        activations_bytes=m.activations_bytes,
        workspace_bytes=m.workspace_bytes, framework_overhead_bytes=m.framework_overhead_bytes,
        gathered_parameters_bytes=0, recompute_bytes=0, host_bytes=0,
        expert_states_bytes=params[1] + grads[1] + state[1],
        dispatch_buffers_bytes=experts.dispatch_buffers_bytes,
        micro_batch=m.per_gpu_batch, strategy=NO_STRATEGY)


def _master_weight_bytes(m: memory.MemoryBreakdown, settings: TrainingSettings) -> int:
    """The fp32 master copy inside `parameters_bytes` (0 when the weights are fp32 already)."""
    if not settings.training:
        raise InvalidRequestError("mode", "memory strategies apply to training only")
    if not settings.mixed_precision:
        return 0
    return MASTER_WEIGHT_BYTES * m.parameter_count


def _activation_bytes(total: int, layout: ActivationLayout | None, strategy: MemoryStrategy,
                      *, tensor_parallel: int, pipeline_parallel: int, in_flight: int,
                      sequence_parallel: bool) -> tuple[int, int]:
    """(activations, of which recomputed) per GPU at the micro-batch."""
    if layout is None:  # no checkpointing and no tensor parallelism (checked by the caller)
        return math.ceil(total / pipeline_parallel * in_flight), 0

    def tp_split(saved: int, replicated: int) -> float:
        if sequence_parallel:
            return saved / tensor_parallel
        return replicated + (saved - replicated) / tensor_parallel

    blocks = layout.blocks
    checkpointed = math.ceil(strategy.checkpointed_fraction * len(blocks))
    kept = float(layout.outside_saved_bytes)  # replicated: embeddings and head (see module)
    recompute = 0.0
    for index, block in enumerate(blocks):
        if index < checkpointed:
            kept += block.input_bytes / (tensor_parallel if sequence_parallel else 1)
            recompute = max(recompute, tp_split(block.saved_bytes, block.replicated_bytes))
        else:
            kept += tp_split(block.saved_bytes, block.replicated_bytes)
    kept_per_gpu = math.ceil(kept / pipeline_parallel * in_flight)
    recompute_bytes = math.ceil(recompute)
    return kept_per_gpu + recompute_bytes, recompute_bytes


def _check_counts(**values: int) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidRequestError(name, f"must be a positive integer, got {value!r}")
